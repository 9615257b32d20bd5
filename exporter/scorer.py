"""The library scorer: THE request path. The HTTP server wraps it and adds nothing to the maths.

    scorer = exporter.load("models/movielens")       # newest complete version
    ctr = scorer.score(request, candidates)          # float32 [N]

FG -> unique keys -> row cache -> store read of the misses -> pool into [N, F, D] and
[N, F] -> one signature call -> calibration.

``store_mode="follow"`` opens the store as a RocksDB secondary of the live writer (the
streaming updater) and starts one daemon thread that, every ``follow_interval_s``,
catches the store up and invalidates the row-cache keys named by each shard's change
log (never the whole cache, unless the log was trimmed past what it had read).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from embstore import RowCache, StoreConfig, open_store
from exporter import scorer_impl
from exporter.calibration import calibrate
from exporter.dense_saved_model import load_dense
from exporter.manifest import DENSE_DIR, STORE_DIR, ModelDirError, complete_versions, load_manifest
from features.fg import FeatureGenerator
from features.spec import parse_spec

log = logging.getLogger("offgraph.scorer")


class Scorer:
    """One loaded model version. Thread-safe for concurrent ``score`` calls."""

    def __init__(self, version_dir: str | Path, *, store_mode: str = "r", item_cache_size: int = 100_000,
                 block_cache_mb: int | None = None, row_cache_mb: float = 0.0, follow_interval_s: float = 0.2,
                 verify: bool = True):
        if isinstance(row_cache_mb, bool) or not isinstance(row_cache_mb, (int, float)) or row_cache_mb < 0:
            raise ValueError(f"row_cache_mb must be a number >= 0, got {row_cache_mb!r}")
        if (isinstance(follow_interval_s, bool) or not isinstance(follow_interval_s, (int, float))
                or not follow_interval_s > 0):
            raise ValueError(f"follow_interval_s must be a number > 0, got {follow_interval_s!r}")
        self.version_dir = Path(version_dir)
        self.manifest = load_manifest(self.version_dir, verify_dense=verify)
        m = self.manifest
        self.version = int(self.version_dir.name) if self.version_dir.name.isdigit() else 0
        self.spec = parse_spec(m["spec"], source=str(self.version_dir / "manifest.json"))
        self.dim = int(m["embedding_dim"])
        self.poolings = [f.pooling for f in self.spec.fields]
        if [f["name"] for f in m["fields"]] != self.spec.field_names:
            raise ModelDirError(f"{self.version_dir}: manifest field order differs from its spec")
        if max(f.rows for f in self.spec.fields) >= 1 << 48:
            raise ModelDirError(f"{self.version_dir}: tables of 2**48 rows or more are not supported")
        self.calibration = self.spec.model.calibration
        self.fg = FeatureGenerator(self.spec, item_cache_size=item_cache_size)
        self._fg_lock = threading.Lock()
        cfg = StoreConfig.from_dict({k: v for k, v in m["store"].items()
                                     if k in StoreConfig.__dataclass_fields__})
        if block_cache_mb is not None:
            cfg = StoreConfig.from_dict({**cfg.to_dict(), "block_cache_mb": block_cache_mb})
        try:
            self.store = open_store(self.version_dir / STORE_DIR, cfg, mode=store_mode)
        except ValueError as e:
            raise ModelDirError(f"{self.version_dir}: store does not open: {e}") from None
        self.row_cache = RowCache(row_cache_mb, self.dim) if row_cache_mb > 0 else None
        self._counts = {"store_rows_read": 0, "cache_hits": 0, "cache_misses": 0}
        self._counts_lock = threading.Lock()
        self._follower: _Follower | None = None
        try:
            self._loaded, self._serve = load_dense(self.version_dir / DENSE_DIR)
            if store_mode == "follow":
                self._follower = _Follower(self.store, self.row_cache, float(follow_interval_s))
        except BaseException:
            self.store.close()
            raise

    # -- the request path -------------------------------------------------------------------
    def features(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]):
        with self._fg_lock:  # the item cache is shared state
            return self.fg.transform(request, candidates)

    def pooled(self, request, candidates) -> tuple[np.ndarray, np.ndarray, dict]:
        """``(emb [N, F, D], first_order [N, F], stats)``: FG, unique keys, row cache, store
        reads of the cache misses only, pooling. ``stats``: lookups, unique_rows,
        cache_hits, store_rows_read and found_rows (of the rows read from the store)."""
        batch = self.features(request, candidates)
        keys = scorer_impl.batch_keys(batch)
        vec, w, hits, read, found = scorer_impl.read_through_cache(self.row_cache, self.store, keys.unique_tables,
                                                                   keys.unique_rows)
        with self._counts_lock:
            c = self._counts
            c["store_rows_read"] += read
            if self.row_cache is not None:
                c["cache_hits"] += hits
                c["cache_misses"] += read
        emb, fo = scorer_impl.pool_batch(batch, keys, vec, w, self.poolings, self.dim)
        stats = {"lookups": int(len(keys.inverse)), "unique_rows": int(len(keys.unique_rows)),
                 "cache_hits": hits, "store_rows_read": read, "found_rows": found}
        return emb, fo, stats

    def dense(self, emb: np.ndarray, first_order: np.ndarray) -> np.ndarray:
        out = self._serve(emb=tf.constant(emb), first_order=tf.constant(first_order))
        return out["ctr"].numpy()

    def score(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> np.ndarray:
        if len(candidates) == 0:
            return np.zeros(0, np.float32)
        emb, fo, _ = self.pooled(request, candidates)
        return calibrate(self.dense(emb, fo), self.calibration)

    def stats(self) -> dict[str, Any]:
        """Cumulative counters (ints) and freshness of this scorer: ``store_rows_read``,
        ``cache_hits``, ``cache_misses``, ``cache_entries``, ``catch_ups``,
        ``last_catch_up_unix`` (0.0 before the first), ``changes_applied`` (change-log keys
        invalidated), ``last_change_ids`` (per shard), ``cache_clears`` (change log trimmed
        past what was read), ``follow_errors``, ``last_catch_up_seconds``."""
        with self._counts_lock:
            out: dict[str, Any] = dict(self._counts)
        cs = self.row_cache.stats() if self.row_cache is not None else None
        out["cache_entries"] = cs["entries"] if cs else 0
        out["cache_capacity_rows"] = cs["capacity_rows"] if cs else 0
        out["cache_bytes"] = cs["bytes"] if cs else 0
        if self._follower is not None:
            out.update(self._follower.stats())
        else:
            out.update({"catch_ups": 0, "last_catch_up_unix": 0.0, "last_catch_up_seconds": 0.0,
                        "changes_applied": 0, "change_records": 0, "cache_clears": 0, "follow_errors": 0,
                        "last_change_ids": []})
        return out

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Follower:
    """The ONE background thread of a follow-mode scorer: catch up, read each shard's
    change log past the last id seen, invalidate those keys in the row cache."""

    def __init__(self, store, cache: RowCache | None, interval_s: float, max_records: int = 10_000):
        self.store, self.cache, self.interval_s, self.max_records = store, cache, interval_s, max_records
        self.shards = store.config.shards
        # start from the current ids: history written before we opened is already in our view
        self.last_ids = [store.last_change_id(s) for s in range(self.shards)]
        self._lock = threading.Lock()
        self._n = {"catch_ups": 0, "changes_applied": 0, "change_records": 0, "cache_clears": 0,
                   "follow_errors": 0}
        self.last_catch_up_unix = 0.0
        self.last_catch_up_seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offgraph-follow", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.step()
            except Exception:  # noqa: BLE001 - keep following; counted and logged
                if self._stop.is_set():
                    return
                with self._lock:
                    self._n["follow_errors"] += 1
                log.exception("following %s failed", self.store.path)

    def step(self) -> None:
        t0 = time.perf_counter()
        keys = records = clears = 0
        for s in range(self.shards):
            # one shard at a time, yielding in between: a catch-up holds the GIL, so
            # requests run between shards instead of waiting for all of them
            time.sleep(0)
            self.store.catch_up(s)
            last = self.last_ids[s]
            newest = self.store.last_change_id(s)
            if newest == last:
                continue
            oldest = self.store.oldest_change_id(s)
            if newest < last or oldest == 0 or oldest > last + 1:
                # the log was trimmed past what we read (or rebuilt): drop the whole cache
                if self.cache is not None:
                    self.cache.clear()
                clears += 1
                self.last_ids[s] = newest
                continue
            while last < newest:
                got, tids, rows = self.store.changes_since(s, last, max_records=self.max_records)
                if got == last:
                    break
                if self.cache is not None:
                    self.cache.invalidate(tids, rows)
                records += got - last
                keys += len(rows)
                last = got
            self.last_ids[s] = last
        done = time.time()  # rows written before the catch-up started are now visible to score()
        with self._lock:
            self._n["catch_ups"] += 1
            self._n["changes_applied"] += keys
            self._n["change_records"] += records
            self._n["cache_clears"] += clears
            self.last_catch_up_unix = done
            self.last_catch_up_seconds = time.perf_counter() - t0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self._n, "last_catch_up_unix": self.last_catch_up_unix,
                    "last_catch_up_seconds": self.last_catch_up_seconds, "last_change_ids": list(self.last_ids)}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def resolve_version(path: str | Path) -> Path:
    """A version directory itself, or a model directory's newest complete version."""
    path = Path(path)
    if (path / "manifest.json").exists() or path.name.isdigit():
        return path
    versions = complete_versions(path)
    if not versions:
        raise ModelDirError(f"{path}: no complete version (a version is complete once its manifest.json exists)")
    return path / str(versions[-1])


def load(model_dir: str | Path, **kwargs) -> Scorer:
    return Scorer(resolve_version(model_dir), **kwargs)
