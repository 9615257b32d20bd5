"""A loaded version (scorer + in-flight count) and the per-model holder that swaps them atomically.

A request takes a reference on the holder's ``current`` version, scores on it and
drops the reference; a swap replaces ``current`` and retires the old version, which
is closed once its last in-flight request has finished.

Labels (``stable``, ``canary``...) name versions an admin asked to serve at once. A labelled version
other than ``current`` is held in ``extra`` and serves the requests that ask for it by label or by
version; a request that names neither gets ``current`` (the newest version, or the pinned one).
A swap that replaces a labelled ``current`` moves it to ``extra`` instead of retiring it, and a version
that loses its last label is retired as a swap would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from offgraph.features.vocabulary import VOCABULARY_UNKNOWN
from offgraph.scoring.memory_budget import MemorySplit
from offgraph.server.models.pacing import Pacer
from offgraph.store import StoreReadError, StoreUnavailable

log = logging.getLogger("offgraph.server")

# cumulative Scorer.stats() counters, summed over a model's retired versions for /metrics
COUNTERS = (
    "store_rows_read",
    "cache_hits",
    "cache_misses",
    "catch_ups",
    "changes_applied",
    "feed_hits",
    "rows_written_through",
    "block_cache_hits",
    "block_cache_misses",
    "ignored_keys",
    "unknown_candidates",
    "unusable_feature_rows",
    "candidate_cache_hits",
    "candidate_cache_misses",
)


def _counted(stats: dict[str, Any]):
    """The ``COUNTERS`` keys, then the per-field counts of vocabulary fields (``vocabulary_unknown:FIELD``)."""
    return (*COUNTERS, *(k for k in stats if k.startswith(VOCABULARY_UNKNOWN)))


class NotServing(LookupError):
    """The model has no loaded version, or not the one asked for."""


class ModelLoading(LookupError):
    """The model has no loaded version yet: its first load is under way (answered 503 + Retry-After)."""


class StoreFailure(Exception):
    """A score failed because the version's store could not be read (answered 503). ``cause`` holds the
    backend's detail (file paths included: for the log only); ``kind`` is a path-free summary."""

    def __init__(self, model: str, version: int, cause: StoreReadError):
        super().__init__(f"model '{model}' version {version}: store read failed ({cause.kind})")
        self.model, self.version, self.cause, self.kind = model, version, cause, cause.kind


class StoreOutage(Exception):
    """A score failed because the version's remote store did not answer in its timeout (answered 503
    with Retry-After; the version stays healthy and serves again once the backend answers)."""

    def __init__(self, model: str, version: int, cause: StoreUnavailable):
        super().__init__(f"model '{model}' version {version}: the store did not answer ({cause})")
        self.model, self.version, self.cause = model, version, cause


def scorer_stats(scorer) -> dict[str, Any]:
    return dict(scorer.stats())


def memory_status(sv: ServedVersion) -> dict[str, Any]:
    """A served version's memory budget and what its parts hold now: ``{"split": MemorySplit.to_dict(),
    "budget_bytes": {part: bytes}, "used_bytes": {part: bytes}}`` (parts: ``offgraph.scoring.memory_budget.PARTS``)."""
    return {
        "split": sv.memory.to_dict(),
        "budget_bytes": sv.memory.budget_bytes(),
        "used_bytes": sv.scorer.memory_in_use(),
    }


class ServedVersion:
    """One loaded model version. ``acquire``/``release`` go through the holder's lock."""

    def __init__(self, scorer, load_seconds: float, memory: MemorySplit | float, prefetcher=None):
        """``memory``: the version's share of the memory budget (a float: a row cache of that size only)."""
        self.scorer = scorer
        self.prefetcher = prefetcher  # offgraph.store.prefetch.Prefetcher still reading its files, or None
        self.version: int = int(scorer.version)
        self.loaded_at = time.time()
        self.load_seconds = load_seconds
        if not isinstance(memory, MemorySplit):
            memory = MemorySplit(
                memory_mb=float(memory),
                models=1,
                row_cache_mb=float(memory),
                block_cache_mb=0,
                item_cache_items=0,
                feed_mb=0.0,
                index_mb=0.0,
            )
        self.memory = memory
        self.row_cache_mb = memory.row_cache_mb
        self.in_flight = 0
        self.retired = False
        self.closed = False
        self.unhealthy: str | None = None  # why, once a score failed on a store read (path-free)

    def resize(self, memory: MemorySplit) -> None:
        """Take a new share of the memory budget (``Scorer.resize_memory``)."""
        self.scorer.resize_memory(memory.row_cache_mb, memory.block_cache_mb, memory.item_cache_items)
        self.memory, self.row_cache_mb = memory, memory.row_cache_mb

    def close(self, share: float = 1.0) -> dict[str, Any]:
        """Close the scorer and free its memory a part at a time (``Scorer.release``), taking ``share``
        of the wall clock (``offgraph.server.models.pacing``); returns its final stats."""
        if self.closed:
            return {}
        self.closed = True
        if self.prefetcher is not None:
            self.prefetcher.stop()
        stats = scorer_stats(self.scorer)
        pacer = Pacer(share)
        t = time.perf_counter()
        try:
            self.scorer.close()
            self.scorer.release(pacer.tick)
        except Exception:  # noqa: BLE001 - closing must not take the server down
            log.exception("closing version %s failed", self.version)
        wall = time.perf_counter() - t
        log.info(
            "closed version %d of %s (memory freed in %.2fs, %.0f ms of it work)",
            self.version,
            self.scorer.version_dir.parent.name,
            wall,
            (wall - pacer.slept_s) * 1e3,
        )
        return stats


@dataclass
class Refusal:
    """A version that did not load (or failed while serving). It is tried again only once its files
    changed (``signature``) and ``retry_at`` (monotonic) has passed; each failure doubles the wait."""

    reason: str
    signature: tuple
    attempts: int = 1
    retry_at: float = 0.0
    at: float = field(default_factory=time.time)


class ModelHolder:
    """Everything the server knows about one model ``MODELS/<name>/``."""

    def __init__(self, name: str, model_dir: Path):
        self.name = name
        self.dir = model_dir
        self._lock = threading.Lock()
        self.current: ServedVersion | None = None
        self.previous_version: int | None = None
        self.loading_version: int | None = None
        self.policy = "latest"  # latest | pinned | unloaded
        self.pinned_version: int | None = None  # with policy "pinned"
        self.labels: dict[str, int] = {}  # label -> version, as an admin set them
        self.extra: dict[int, ServedVersion] = {}  # labelled versions served beside ``current``
        self.on_store_error: Callable[[ModelHolder, ServedVersion], None] | None = None  # must not block
        self.release_share = (
            1.0  # a retired version's memory is freed in this share of the time (offgraph.server.models.pacing)
        )
        self.refused: dict[int, Refusal] = {}
        self.versions_on_disk: list[int] = []  # complete versions, as of the last poll
        self.last_error: str | None = None
        self.attempted = False  # a load has been tried (readiness)
        self.scans = 0  # polls of MODELS that looked at this model (lets a client wait for the next one)
        self.updater: dict | None = None  # the updater's status file, as of the last poll
        self.retired_totals: Counter = Counter()
        self.closed = False

    # -- request path ------------------------------------------------------------------------
    def acquire(self, version: int | None = None, label: str | None = None) -> ServedVersion:
        """Take a reference on the version a request asks for: the one ``label`` names, else ``version``,
        else ``current``. ``NotServing`` when it is not loaded, ``ModelLoading`` while nothing serves yet."""
        with self._lock:
            sv = self._find(version, label)
            sv.in_flight += 1
            return sv

    def peek(self, version: int | None = None, label: str | None = None) -> ServedVersion | None:
        """The version ``acquire`` would take now, without a reference (None where it raises)."""
        with self._lock:
            try:
                return self._find(version, label)
            except LookupError:
                return None

    def _find(self, version: int | None, label: str | None) -> ServedVersion:
        if label is not None:
            if label not in self.labels:
                known = ", ".join(f"{k}={v}" for k, v in sorted(self.labels.items())) or "none"
                raise NotServing(f"model '{self.name}' has no label '{label}' (labels: {known})")
            if version is not None and version != self.labels[label]:
                raise NotServing(
                    f"label '{label}' of model '{self.name}' names version {self.labels[label]}, not {version}"
                )
            version = self.labels[label]
            if version not in self.extra and (self.current is None or self.current.version != version):
                raise NotServing(
                    f"label '{label}' of model '{self.name}' names version {version}, which is not loaded"
                    + (f" ({self.last_error})" if self.last_error else "")
                )
        sv = self.current
        if version is not None and version in self.extra:
            return self.extra[version]
        if sv is None:
            if self.policy != "unloaded" and (self.loading_version is not None or not self.attempted):
                raise ModelLoading(f"model '{self.name}' is loading: no version serves yet")
            raise NotServing(
                f"model '{self.name}' has no loaded version"
                + (" (unloaded by an admin)" if self.policy == "unloaded" else "")
            )
        if version is not None and version != sv.version:
            served = ", ".join(map(str, sorted([sv.version, *self.extra])))
            raise NotServing(f"version {version} of model '{self.name}' is not loaded (it serves version {served})")
        return sv

    def release(self, sv: ServedVersion) -> None:
        with self._lock:
            sv.in_flight -= 1
            drained = sv.retired and sv.in_flight == 0
        if drained:  # not on this request's thread: closing a store and dropping a model takes milliseconds
            threading.Thread(target=self._close, args=(sv,), name=f"offgraph-close-{self.name}", daemon=True).start()

    def score(
        self, request: dict, candidates: list[dict], version: int | None, label: str | None = None
    ) -> tuple[int, np.ndarray, Any, str]:
        """Score on the current version (or the one asked for, by version or label); runs in a scoring
        thread. Returns (version, scores, the feature join's result: ``offgraph.feature_tables.join.Joined``,
        what the scores are: the version's ``score_kind``)."""
        sv = self.acquire(version, label)
        try:
            return (sv.version, *sv.scorer.score_joined(request, candidates), sv.scorer.score_kind)
        except StoreUnavailable as e:  # the backend did not answer: nothing wrong with the version
            raise StoreOutage(self.name, sv.version, e) from e
        except StoreReadError as e:
            with self._lock:
                first, sv.unhealthy = (
                    sv.unhealthy is None,
                    sv.unhealthy or f"store read failed while serving ({e.kind})",
                )
            if first and self.on_store_error is not None:
                self.on_store_error(self, sv)
            raise StoreFailure(self.name, sv.version, e) from e
        finally:
            self.release(sv)

    # -- swaps -------------------------------------------------------------------------------
    def swap(self, new: ServedVersion | None) -> ServedVersion | None:
        """Make ``new`` current (None: unload, labelled versions too); the old version drains, then
        closes, unless a label names it: it then serves on beside the new one. ``new`` may be one of
        ``extra`` (a labelled version becoming the default). Returns the version retired, if any."""
        retire: list[ServedVersion] = []
        with self._lock:
            if self.closed and new is not None:
                old, new_closed = None, True
            else:
                old, self.current, new_closed = self.current, new, False
                if new is not None and self.extra.get(new.version) is new:
                    del self.extra[new.version]
                if new is None:  # unloaded: nothing serves, whatever its labels
                    retire, self.extra = list(self.extra.values()), {}
                if old is not None:
                    self.previous_version = old.version
                    if new is not None and old.version in self.labels.values():
                        self.extra[old.version] = old
                    else:
                        retire.append(old)
            for sv in retire:
                sv.retired = True
            drained = [sv for sv in retire if sv.in_flight == 0]
        if new_closed and new is not None:
            self._close(new)
            return None
        if old is not None:
            log.info(
                "model %s: version %s -> %s (%s)",
                self.name,
                old.version,
                new.version if new else "unloaded",
                f"old version drains {old.in_flight} in-flight requests"
                if old in retire
                else "old version serves on: labelled "
                + ", ".join(k for k, v in sorted(self.labels.items()) if v == old.version),
            )
        for sv in drained:
            self._close(sv)
        return old if old in retire else None

    def add_labelled(self, sv: ServedVersion) -> None:
        """Serve ``sv`` beside ``current`` (a label names it); closed at once if it is already served."""
        with self._lock:
            dup = (
                self.closed
                or sv.version in self.extra
                or (self.current is not None and self.current.version == sv.version)
            )
            if not dup:
                self.extra[sv.version] = sv
        if dup:
            self._close(sv)

    def retire_unlabelled(self) -> list[int]:
        """Retire the versions of ``extra`` no label names any more (each drains, then closes); returns them."""
        with self._lock:
            named = set(self.labels.values())
            gone = [sv for v, sv in self.extra.items() if v not in named]
            for sv in gone:
                del self.extra[sv.version]
                sv.retired = True
            drained = [sv for sv in gone if sv.in_flight == 0]
        for sv in gone:
            log.info(
                "model %s: version %d no longer labelled: it drains %d in-flight requests",
                self.name,
                sv.version,
                sv.in_flight,
            )
        for sv in drained:
            self._close(sv)
        return [sv.version for sv in gone]

    def served(self) -> list[ServedVersion]:
        """Every version that serves: ``current`` first, then the labelled ones by version."""
        with self._lock:
            return ([self.current] if self.current is not None else []) + [self.extra[v] for v in sorted(self.extra)]

    def _close(self, sv: ServedVersion) -> None:
        stats = sv.close(1.0 if self.closed else self.release_share)  # shutting down: nothing left to yield to
        with self._lock:
            for k in _counted(stats):
                v = stats.get(k)
                if isinstance(v, (int, float)):
                    self.retired_totals[k] += v  # type: ignore[assignment]  # a Counter sums floats too

    def close(self) -> None:
        with self._lock:
            self.closed = True
        self.swap(None)

    # -- reporting ----------------------------------------------------------------------------
    def counters(self) -> tuple[int | None, dict[str, float]]:
        """(default version, cumulative counters over every version this process served)."""
        with self._lock:
            sv = self.current
            totals = dict(self.retired_totals)
        for s in self.served():
            stats = scorer_stats(s.scorer) if not s.closed else {}
            for k in _counted(stats):
                v = stats.get(k)
                if isinstance(v, (int, float)):
                    totals[k] = totals.get(k, 0) + v
            if s is sv:
                for k in ("last_feed_poll_unix", "last_catch_up_unix"):
                    if k in stats:
                        totals[k] = stats[k]
        return (sv.version if sv is not None else None), totals

    def vocabulary_free(self) -> dict[str, int]:
        """Rows left for appended ids per vocabulary field with a capacity, in the default version (none serving:
        nothing)."""
        with self._lock:
            sv = self.current
        if sv is None or sv.closed:
            return {}
        return {name: a.free for name, a in sv.scorer.fg.appended.items()}

    def memory(self) -> dict[str, Any] | None:
        """The serving versions' ``budget_bytes`` and ``used_bytes``, summed over them; None when none serves."""
        parts = [memory_status(s) for s in self.served() if not s.closed]
        if not parts:
            return None
        return {
            key: {p: sum(m[key][p] for m in parts) for p in parts[0][key]} for key in ("budget_bytes", "used_bytes")
        }

    @property
    def state(self) -> str:
        if self.policy == "unloaded" and self.current is None:
            return "unloaded"
        if self.current is not None:
            return "serving"
        if self.loading_version is not None:
            return "loading"
        return "failed" if self.attempted else "new"
