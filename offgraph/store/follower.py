"""The ONE background thread of a follow-mode scorer, and the fresh-row lookup it serves.

Fresh rows come from the writer's feed (``offgraph.store.feed``): memory-mapped epoch files
in /dev/shm where the streaming updater stages rows BEFORE it writes them to RocksDB
and publishes them once RocksDB holds them (a torn read: ``FeedTornRead``, a 503). The
request path looks keys up there first (:meth:`Follower.lookup`), then in the row
cache, then in the RocksDB view. Nothing is copied into this process per written
row: the thread only maps new epochs (every ``poll_s``: the freshness) and, every
``catch_up_s``, catches the RocksDB secondary up (``try_catch_up_with_primary``
holds the GIL for milliseconds per shard, which is why it is rare) and lets go of
the epochs that the caught-up view covers.

Catch-up: read the newest epoch's "batch begun" b; catch up shard by shard (the view
then holds every batch before b: the writer starts a batch in the feed before it
writes it to the store); for each epoch whose batches all come before b, invalidate
its keys in the row cache (while a key is in a mapped epoch it shadows the cache, so
a cached copy may be stale; a reader takes the cache epoch BEFORE it looks at the
feed, so its cache insert of an older read is refused after this), then drop it.
A key is therefore never served older than it was before. If epoch ids jump (an
epoch was created and deleted unseen) or go back (a new feed), the catch-up comes
at once and the whole row cache is cleared.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from offgraph.store.feed import FeedTornRead
from offgraph.store.keys import split_keys
from offgraph.store.row_cache import RowCache

log = logging.getLogger("offgraph.scorer")


class Activity:
    """Counts the scores in progress, so that the follower can do its work between them.

    with activity: ...                  # around a score
    activity.wait_idle(0.005)           # follower: until none runs, or 5 ms
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._n = 0

    def __enter__(self):
        with self._cond:
            self._n += 1
        return self

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._n -= 1
            if self._n == 0:
                self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._n == 0, timeout_s)


COUNTERS = (
    "catch_ups",
    "changes_applied",
    "cache_clears",
    "follow_errors",
    "epochs_mapped",
    "epochs_released",
    "feed_hits",
    "rows_written_through",
)
# what Follower.stats() says of a scorer that does not follow
NOT_FOLLOWING = {
    **dict.fromkeys(COUNTERS, 0),
    "last_feed_poll_unix": 0.0,
    "last_catch_up_unix": 0.0,
    "last_catch_up_seconds": 0.0,
    "follow_cpu_seconds": 0.0,
    "feed_rows": 0,
    "epochs": 0,
}


class Follower:
    def __init__(
        self,
        store,
        cache: RowCache | None,
        poll_s: float,
        *,
        catch_up_s: float = 30.0,
        chunk_rows: int = 1024,
        pause_s: float = 0.001,
        max_defer_s: float = 0.005,
        spread_s: float = 5.0,
        shard_pause_s: float = 0.05,
        idle: Activity | None = None,
        on_catch_up: Callable[[], None] | None = None,
    ):
        """``on_catch_up``: called after each catch-up of the store view (the scorer reads the keys appended to
        its vocabularies, which the view holds as meta records)."""
        for name, val in (("poll_s", poll_s), ("catch_up_s", catch_up_s)):
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not val > 0:
                raise ValueError(f"{name} must be a number > 0, got {val!r}")
        self.store, self.cache, self.codec = store, cache, store.codec
        self.poll_s, self.catch_up_s = float(poll_s), float(catch_up_s)
        self.chunk_rows, self.pause_s, self.max_defer_s, self.idle = chunk_rows, float(pause_s), max_defer_s, idle
        self.spread_s, self.shard_pause_s = float(spread_s), float(shard_pause_s)
        self.feed = store.feed_reader()
        self.shards = store.config.shards
        self._lock = threading.Lock()
        self._n = dict.fromkeys(COUNTERS, 0)
        self.last_feed_poll_unix = 0.0  # rows the writer fed before this time are served
        self.last_catch_up_unix = 0.0  # rows written before this time are in the RocksDB view
        self.last_catch_up_seconds = 0.0
        self.cpu_seconds = 0.0  # CPU time of this thread (mapping, catch-ups, invalidations)
        self._last_rocksdb_catch_up = -float("inf")
        self._clear_cache = False
        self._on_catch_up = on_catch_up
        self._catch_up_now = False
        self._stop = threading.Event()
        # a store shared over machines tells of the rows its writer writes (the feed is the writer's
        # machine's): they leave the row cache, and the next request reads them fresh
        self.watching = cache is not None and store.watch_changes(self._rows_changed, self._changes_lost)
        self._thread = threading.Thread(target=self._run, name="offgraph-follow", daemon=True)
        self._thread.start()

    def _rows_changed(self, tids: np.ndarray, rows: np.ndarray) -> None:
        assert self.cache is not None
        self.cache.invalidate(tids, rows)
        with self._lock:
            self._n["changes_applied"] += len(rows)

    def _changes_lost(self) -> None:
        assert self.cache is not None
        self.cache.clear()

    # ------------------------------------------------------------------ request path
    def lookup(self, keys: np.ndarray):
        """The rows of ``keys`` (combined keys, ``offgraph.store.keys.combine_keys``) the feed holds: ``(positions
        int64 [H], vectors float32 [H, D], first_order float32 [H])``, or None if none."""
        if not self.feed.epochs:
            return None
        pos, recs = self.feed.lookup(keys)
        if len(pos) == 0:
            return None
        vec, w = self.codec.decode(recs)
        with self._lock:
            self._n["feed_hits"] += len(pos)
        return pos, vec, w

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        while not self._stop.is_set():
            cpu0 = time.thread_time()
            try:
                self.step()
            except Exception:  # noqa: BLE001 - keep following; counted and logged
                if self._stop.is_set():
                    return
                with self._lock:
                    self._n["follow_errors"] += 1
                log.exception("following %s failed", self.store.path)
            finally:
                with self._lock:
                    self.cpu_seconds += time.thread_time() - cpu0
            self._stop.wait(self.poll_s)

    def step(self) -> None:
        started = time.time()
        self._map_new()
        with self._lock:
            self.last_feed_poll_unix = started
        if self._catch_up_now or time.monotonic() - self._last_rocksdb_catch_up >= self.catch_up_s:
            self._catch_up()

    def _map_new(self) -> None:
        """Map new epochs. A new empty one (the writer's periodic rollover) makes the
        catch-up come now, so that the epoch before it is released soon: lookups then
        mostly search one epoch."""
        added, gap = self.feed.refresh()
        if gap:
            log.warning(
                "%s: feed epochs jumped or went back: catching up now and clearing the row cache", self.store.path
            )
            self._clear_cache = True
        if gap or any(ep.copy_of == 0 for ep in added) and len(self.feed.epochs) > 1:
            self._catch_up_now = True
        with self._lock:
            self._n["epochs_mapped"] += len(added)

    def _catch_up(self) -> None:
        t0, started = time.perf_counter(), time.time()
        self._catch_up_now = False
        begun = self.feed.begun()
        for s in range(self.shards):
            # one shard at a time, well apart: a catch-up holds the GIL for milliseconds, so
            # a request meets at most one of them
            self._yield(self.shard_pause_s)
            self.store.catch_up(s)
        self._last_rocksdb_catch_up = time.monotonic()
        if self._on_catch_up is not None:
            self._on_catch_up()
        clear, self._clear_cache = self._clear_cache, False
        if clear and self.cache is not None:
            self.cache.clear()
        invalidated = 0
        for ep in self.feed.covered(begun):
            if self.cache is not None and not clear:
                keys = ep.used_keys()
                tids, rows = split_keys(keys)
                # spread over about spread_s: a fraction of a ms now and then, not a burst
                pause = min(0.05, max(self.pause_s, self.spread_s * self.chunk_rows / max(len(keys), 1)))
                last_map = time.monotonic()
                for i in range(0, len(keys), self.chunk_rows):
                    chunk = slice(i, i + self.chunk_rows)
                    self.cache.invalidate(tids[chunk], rows[chunk])
                    self._write_through(keys[chunk], tids[chunk], rows[chunk])
                    self._yield(pause)
                    if time.monotonic() - last_map >= self.poll_s:  # stay fresh meanwhile
                        self._map_new()
                        last_map = time.monotonic()
                invalidated += len(keys)
            self.feed.release([ep])
            with self._lock:
                self._n["epochs_released"] += 1
        with self._lock:
            self._n["catch_ups"] += 1
            self._n["changes_applied"] += invalidated
            self._n["cache_clears"] += int(clear and self.cache is not None)
            self.last_catch_up_unix = started
            self.last_catch_up_seconds = time.perf_counter() - t0

    def _write_through(self, keys: np.ndarray, tids: np.ndarray, rows: np.ndarray) -> None:
        """Streamed rows stay hot: the rows of an epoch being released go back into the row cache at the
        newest value the feed holds (the view just caught up holds it too), so the first request after
        the release does not read them from disk. Safe by the cache's epoch rule: the insert's epoch is
        taken AFTER their invalidation, so a request that read one of them from the store before it
        cannot cache its older copy (refused), and a write that comes after the feed read lands in a
        newer epoch, which shadows the cache until it is released in turn. Admission may decline a row
        (``RowCache.insert``): it is then read from the store when next asked, as before."""
        epoch = self.cache.epoch
        try:
            pos, recs = self.feed.lookup(keys)
        except FeedTornRead:  # being rewritten as we read: left invalidated
            return
        if len(pos):
            self.cache.insert(tids[pos], rows[pos], recs, epoch)
            with self._lock:
                self._n["rows_written_through"] += len(pos)

    def _yield(self, pause_s: float | None = None) -> None:
        """Between chunks of work: a real sleep, not ``sleep(0)`` (a thread that drops
        the GIL and asks for it straight back usually gets it again, and a request
        thread waiting for it then waits out the whole switch interval, 5 ms), then
        until no score is running (at most ``max_defer_s``)."""
        pause = self.pause_s if pause_s is None else pause_s
        if pause > 0:
            self._stop.wait(pause)
        if self.idle is not None:
            self.idle.wait_idle(self.max_defer_s)

    # ------------------------------------------------------------------ outside
    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                **self._n,
                "last_feed_poll_unix": self.last_feed_poll_unix,
                "last_catch_up_unix": self.last_catch_up_unix,
                "last_catch_up_seconds": self.last_catch_up_seconds,
                "follow_cpu_seconds": self.cpu_seconds,
                "feed_rows": self.feed.rows(),
                "epochs": len(self.feed.epochs),
            }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
