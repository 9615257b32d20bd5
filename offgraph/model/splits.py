"""Train/held-out splits by string key: random, global chronological, per-key chronological."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def split_random(n: int, frac: float, seed: int, **_) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.random(n) < frac


def split_time(n: int, frac: float, time: np.ndarray | None, **_) -> np.ndarray:
    if time is None:
        raise ValueError("split 'time' needs the spec's 'time' column")
    order = np.argsort(time, kind="stable")
    test = np.zeros(n, dtype=bool)
    test[order[int(np.floor(n * (1 - frac))) :]] = True
    return test


def split_per_key_time(n: int, frac: float, time: np.ndarray | None, key: np.ndarray | None, **_) -> np.ndarray:
    """Each key's last ``frac`` of rows (by time, ties in input order) are held out."""
    if time is None or key is None:
        raise ValueError("split 'per-key-time' needs the spec's 'time' and 'split_key' columns")
    _, kid = np.unique(key, return_inverse=True)
    order = np.lexsort((np.arange(n), time, kid))
    ks = kid[order]
    first = np.r_[0, np.flatnonzero(ks[1:] != ks[:-1]) + 1]
    counts = np.diff(np.r_[first, n])
    rank = np.arange(n) - np.repeat(first, counts)
    cut = np.floor(counts * (1 - frac)).astype(np.int64)
    test = np.zeros(n, dtype=bool)
    test[order] = rank >= np.repeat(cut, counts)
    return test


SPLITS: dict[str, Callable[..., np.ndarray]] = {
    "random": split_random,
    "time": split_time,
    "per-key-time": split_per_key_time,
}


def held_out_mask(name: str, n: int, frac: float = 0.2, seed: int = 0, time=None, key=None) -> np.ndarray:
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}: expected one of {sorted(SPLITS)}")
    if not 0 < frac < 1:
        raise ValueError(f"held-out fraction must be in (0, 1), got {frac}")
    return SPLITS[name](n=n, frac=frac, seed=seed, time=time, key=key)
