"""A model's online experiment: sticky traffic split over arms, its layout, and its record under MODELS.

An experiment (``PUT /v1/models/{name}/experiment``) splits the requests that name no version or label over
``arms``, each a label, a version or the ``prior`` arm, with a weight. A request's arm is fixed by its
``sticky_key`` (a request feature, e.g. ``user_id``): ``unit(salt, value)`` maps the value to a point in [0, 1)
with xxhash64, and the arm whose ranges hold that point serves it. The same value lands in the same arm on any
worker, in any process, after any restart, as long as the salt and the layout do not change.

**Layout.** Each arm owns a list of ranges of [0, 1) whose lengths sum to its weight. A new experiment (or a
new salt) lays the arms out one after the other, in the order given: 0.8/0.1/0.1 is [0, .8), [.8, .9),
[.9, 1). A later PUT with the same salt keeps every arm where it was (arms are the same arm when they name
the same label, the same version, or are both the prior arm): an arm whose weight falls gives up the top of
its ranges, an arm dropped gives up all of them, and an arm whose weight rises (or a new arm) takes the
freed ranges, lowest first, in the order of the arms. So a change moves only the users it must: 0.8/0.1/0.1 ->
0.7/0.1/0.2 gives [.7, .8) from the first arm to the third, and the second arm's users do not move (the plain
cumulative split would have shifted them all).

**No sticky key.** A request without a value for the sticky key (missing, null, "" or []) is served by the
first arm (the control) and counted (``offgraph_experiment_unassigned_total``): the split cannot be sticky
for it. Values are hashed as their JSON text for numbers and booleans, as themselves for strings: ``196`` and
``"196"`` are the same user.

**The prior arm** (``{"prior": true}``) scores no model: it answers the candidates in the order they were
sent, as scores ``(n - i) / n`` for the i-th of n candidates (``score_kind: ranking``, no version), so an
order by descending score is the order sent, the caller's own rule-based order (an item prior, recency...).

**Record.** ``MODELS/<model>/experiment.json`` (beside ``admin-policy.json``), written atomically and
fsynced before the PUT answers. Every worker reads it when it changes (one ``stat`` a request), so after the
PUT's 200 every worker assigns by it, and a restarted server does too.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from offgraph.server.models.control import _write_json

EXPERIMENT_FILE = "experiment.json"
MAX_ARMS = 6
"""Arms an experiment may have: each is a series of every per-arm metric (bounded label cardinality), and a
label arm holds a share of the model's memory (at most ``MAX_LABELS`` labels, the default version, the prior)."""
WEIGHT_TOLERANCE = 1e-9
"""How far from 1 the arms' weights may sum (they are not normalised: what is asked is what is served)."""
PRIOR_ARM = "prior"
NO_ARM = "none"
"""The arm label of the requests outside any experiment (none set, or a version or label named in the body)."""
_UNIT = 2.0**-53


def unit(salt: str, value: str) -> float:
    """The point of [0, 1) where ``value`` falls under ``salt``: the top 53 bits of xxhash64 (exact in a float)."""
    return (xxhash.xxh64_intdigest(f"{salt}\x1f{value}".encode()) >> 11) * _UNIT


def sticky_value(request: dict, key: str) -> str | None:
    """The request's value of the sticky key as hashed (None: no value, the request cannot be assigned)."""
    v = request.get(key)
    if v is None or v == "" or v == []:
        return None
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


@dataclass(frozen=True)
class Arm:
    """One arm: ``kind`` "label" (``ref`` the label), "version" (``ref`` the version) or "prior"."""

    kind: str
    ref: str | int | None
    weight: float
    ranges: tuple[tuple[float, float], ...] = ()

    @property
    def name(self) -> str:
        """The arm as metrics and responses name it: the label, ``v<version>``, or ``prior``."""
        return PRIOR_ARM if self.kind == "prior" else f"v{self.ref}" if self.kind == "version" else str(self.ref)

    @property
    def identity(self) -> tuple[str, Any]:
        return self.kind, self.ref

    @property
    def selection(self) -> tuple[int | None, str | None]:
        """(version, label) a model arm scores with, as a body naming it would ask (the prior arm: neither)."""
        if self.kind == "version":
            return self.ref, None  # type: ignore[return-value]  # a version arm's ref is its version (an int)
        return (None, str(self.ref)) if self.kind == "label" else (None, None)

    def as_json(self) -> dict:
        out: dict[str, Any] = {"prior": True} if self.kind == "prior" else {self.kind: self.ref}
        return {**out, "arm": self.name, "weight": self.weight, "ranges": [list(r) for r in self.ranges]}


def arm_from_json(d: dict) -> Arm:
    """An arm of a PUT body or of the record; ValueError naming what is wrong."""
    kinds = [k for k in ("label", "version", "prior") if d.get(k) not in (None, False)]
    if len(kinds) != 1:
        raise ValueError(f"an arm names exactly one of label, version or prior: true, got {d!r}")
    kind = kinds[0]
    ref = None if kind == "prior" else d[kind]
    w = d.get("weight")
    if isinstance(w, bool) or not isinstance(w, int | float) or not math.isfinite(w) or not 0 < w <= 1:
        raise ValueError(f"arm {d!r}: weight must be a number in (0, 1], got {w!r}")
    ranges = tuple((float(lo), float(hi)) for lo, hi in d.get("ranges", ()))
    return Arm(kind, ref, float(w), ranges)


def check_arms(arms: list[Arm]) -> None:
    """ValueError naming the problem: no arm, too many, an arm twice, weights not summing to 1."""
    if not 1 <= len(arms) <= MAX_ARMS:
        raise ValueError(f"an experiment has 1 to {MAX_ARMS} arms, got {len(arms)}")
    seen = set()
    for a in arms:
        if a.identity in seen:
            raise ValueError(f"arm {a.name!r} is given twice")
        seen.add(a.identity)
    total = math.fsum(a.weight for a in arms)
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(f"the arms' weights must sum to 1 (within {WEIGHT_TOLERANCE:g}), got {total!r}")


def _merge(ranges: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    out: list[tuple[float, float]] = []
    for lo, hi in sorted(r for r in ranges if r[1] > r[0]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return tuple(out)


def _trim(ranges: tuple[tuple[float, float], ...], keep: float) -> tuple[tuple[float, float], ...]:
    """The lowest ``keep`` of ``ranges`` (their top given up)."""
    out = []
    for lo, hi in ranges:
        if keep <= 0:
            break
        out.append((lo, min(hi, lo + keep)))
        keep -= hi - lo
    return tuple(out)


def layout(arms: list[Arm], previous: list[Arm] | None) -> list[Arm]:
    """``arms`` with their ranges: laid out in order when there is no ``previous`` layout (of the same salt),
    else moving only what the new weights must move (the module's rule)."""
    if not previous:
        out, lo = [], 0.0
        for i, a in enumerate(arms):
            hi = 1.0 if i == len(arms) - 1 else lo + a.weight
            out.append(Arm(a.kind, a.ref, a.weight, ((lo, hi),)))
            lo = hi
        return out
    before = {a.identity: a.ranges for a in previous}
    kept = [_trim(before.get(a.identity, ()), a.weight) for a in arms]
    taken = sorted(r for rs in kept for r in rs)
    free, at = [], 0.0
    for lo, hi in taken:  # the complement of what the arms keep
        if lo > at:
            free.append((at, lo))
        at = max(at, hi)
    if at < 1.0:
        free.append((at, 1.0))
    owned: list[list[tuple[float, float]]] = []
    for i, a in enumerate(arms):
        need = a.weight - sum(hi - lo for lo, hi in kept[i])
        got = list(kept[i])
        while need > 0 and free:
            lo, hi = free[0]
            if hi - lo <= need:
                got.append(free.pop(0))
                need -= hi - lo
            else:
                got.append((lo, lo + need))
                free[0] = (lo + need, hi)
                need = 0
        owned.append(got)
    # what float rounding leaves free (a few ulps, weights summing to 1 within the tolerance) goes to the first arm
    if free:
        owned[0].extend(free)
    return [Arm(a.kind, a.ref, a.weight, _merge(rs)) for a, rs in zip(arms, owned, strict=True)]


class Experiment:
    """A model's experiment as recorded: ``assign(request)`` gives the arm of a request."""

    def __init__(self, arms: list[Arm], sticky_key: str, salt: str, generation: int):
        self.arms, self.sticky_key, self.salt, self.generation = arms, sticky_key, salt, generation
        edges = sorted((lo, i) for i, a in enumerate(arms) for lo, _ in a.ranges)
        self._starts = [lo for lo, _ in edges]
        self._arm_at = [i for _, i in edges]

    def arm_at(self, u: float) -> Arm:
        """The arm whose ranges hold ``u`` (ranges tile [0, 1): the one starting last at or before it)."""
        return self.arms[self._arm_at[max(bisect.bisect_right(self._starts, u) - 1, 0)]]

    def assign(self, request: dict) -> tuple[Arm, bool]:
        """(the request's arm, whether it was assigned by its sticky key: False, the first arm for lack of one)."""
        value = sticky_value(request, self.sticky_key)
        if value is None:
            return self.arms[0], False
        return self.arm_at(unit(self.salt, value)), True

    def as_json(self) -> dict:
        return {
            "sticky_key": self.sticky_key,
            "salt": self.salt,
            "generation": self.generation,
            "arms": [a.as_json() for a in self.arms],
        }

    @classmethod
    def from_json(cls, d: Any, where: str) -> Experiment:
        try:
            if (
                not isinstance(d, dict)
                or not isinstance(d.get("sticky_key"), str)
                or not isinstance(d.get("salt"), str)
            ):
                raise ValueError("not an experiment record (sticky_key, salt, arms)")
            arms = [arm_from_json(a) for a in d.get("arms", ())]
            check_arms(arms)
            if any(not a.ranges for a in arms):
                arms = layout(arms, None)
            return cls(arms, d["sticky_key"], d["salt"], int(d.get("generation", 0)))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{where}: {e}") from None


def prior_scores(n: int):
    """The prior arm's scores: ``(n - i) / n`` for the i-th of ``n`` candidates (the order sent, descending)."""
    import numpy as np

    return (n - np.arange(n, dtype=np.float64)) / n


class Experiments:
    """The experiments of the models under MODELS, each read again from its record when that changes."""

    def __init__(self, models_dir: Path):
        self.models_dir = Path(models_dir)
        self._cache: dict[str, tuple[tuple[int, int, int], Experiment]] = {}

    def path(self, model: str) -> Path:
        return self.models_dir / model / EXPERIMENT_FILE

    def get(self, model: str) -> Experiment | None:
        """The model's experiment now (None: none). One ``stat`` a call: a record another worker wrote is seen
        by the next request. A record that cannot be read serves no experiment (and PUT replaces it)."""
        path = self.path(model)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._cache.pop(model, None)
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        hit = self._cache.get(model)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        try:
            exp = Experiment.from_json(json.loads(path.read_text()), str(path))
        except (OSError, ValueError):
            self._cache.pop(model, None)
            return None
        self._cache[model] = (stamp, exp)
        return exp

    def _locked(self, model: str):
        """An exclusive lock on the model's experiment (PUT and DELETE by several workers at once)."""
        fd = os.open(self.models_dir / model / ".experiment.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def put(self, model: str, arms: list[Arm], sticky_key: str, salt: str | None) -> Experiment:
        """Record the model's experiment (durably) and return it. ``salt`` None: the current experiment's salt,
        or a new random one. The layout follows the module's rule."""
        check_arms(arms)
        fd = self._locked(model)
        try:
            current = self.get(model)
            if salt is None:
                salt = current.salt if current is not None else secrets.token_hex(8)
            previous = current.arms if current is not None and current.salt == salt else None
            exp = Experiment(layout(arms, previous), sticky_key, salt, time.time_ns())
            _write_json(self.path(model), exp.as_json(), durable=True)
            return exp
        finally:
            os.close(fd)

    def delete(self, model: str) -> Experiment | None:
        """Remove the model's experiment (durably); the one removed, or None if there was none."""
        fd = self._locked(model)
        try:
            current = self.get(model)
            path = self.path(model)
            try:
                path.unlink()
            except FileNotFoundError:
                return None
            dfd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
            self._cache.pop(model, None)
            return current
        finally:
            os.close(fd)
