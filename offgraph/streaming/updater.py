"""`offgraph update`: apply delta files to the live model version's store, exactly once.

    up = Updater("models", "ml", open_source("spool:/data/spool"), UpdaterConfig(batch_files=16))
    up.run()                      # until stop() (SIGTERM); run(once=True): until drained

Exactly once (see offgraph/streaming/README.md): every store write carries, in the SAME atomic
batch of every shard, the position of the last item it holds under each position key
(the spool: one key, file names; Kafka: one key per partition, offsets). On start the
per-shard positions are read back: items at or before the lowest are done; an item
between a shard's position and the highest (a crash between the shard batches of one
write) is re-applied to the shards that lack it only.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from offgraph.feature_tables.apply import FeatureTables
from offgraph.feature_tables.db import FeatureTableError
from offgraph.modeldir.status_file import write_status
from offgraph.store import shard_of
from offgraph.store.errors import StoreRemoteError, StoreUnavailable
from offgraph.store.keys import BIAS_ROW, BIAS_TABLE
from offgraph.streaming.deltas import DeltaBatch, DeltaFormatError, FeatureDeltaBatch
from offgraph.streaming.live_version import LiveModel
from offgraph.streaming.log_limit import RepeatLimiter
from offgraph.streaming.metrics import UpdaterMetrics
from offgraph.streaming.model_limits import ModelLimits
from offgraph.streaming.sources import DeltaSource, SourceItem
from offgraph.streaming.updater_config import UpdaterConfig

log = logging.getLogger("offgraph.update")

REMOTE_RETRY_S = (0.2, 5.0)
"""The wait before reopening a remote store after an error: doubled each time, from the first to the last."""
REMOTE_LOG_S = 10.0
"""A remote store's errors are logged at most once this often (a cluster down fails every attempt)."""

REMOTE_ERRORS = (StoreRemoteError, StoreUnavailable)
"""A remote store that did not answer: a write or open that did not go through (StoreRemoteError), or a
read that timed out or lost its connection (StoreUnavailable: the seq read-back of a write, the positions
read at start). Either way nothing of the batch was applied and the store is not at fault: reopen, go on."""

APPLY, WAIT, SWITCH = "apply", "wait", "switch"


# -- the NumPy side: checks against the manifest, batching, per-shard catch-up ----------------------


def check_batch(b: DeltaBatch, lim: ModelLimits) -> str | None:
    """Why ``b`` cannot be applied to ``lim``'s version (None: it can). Model name and
    version are the caller's (they decide between refusing and waiting). Every check the
    store's write would make of these values is made here, per file and vectorized, so
    that one bad file is refused alone, before anything of its batch is written."""
    if b.dim != lim.dim:
        return f"dim {b.dim} but model {lim.model} version {lim.version} has embedding_dim {lim.dim}"
    if len(b) == 0:
        return None
    n_tables = len(lim.table_rows)
    bias = b.table_ids == BIAS_TABLE  # the model's streamed bias offset (offgraph.store.keys): one row, row 0
    bad_b = bias & (b.rows != BIAS_ROW)
    if bad_b.any():
        i = int(np.argmax(bad_b))
        return f"delta {i} names row {int(b.rows[i])} of the bias table {BIAS_TABLE}, which has one row, {BIAS_ROW}"
    bad_t = (b.table_ids >= n_tables) & ~bias
    if bad_t.any():
        i = int(np.argmax(bad_t))
        return (
            f"{int(bad_t.sum())} deltas name table ids >= {n_tables} (the number of fields; {BIAS_TABLE}: the bias); "
            f"first: delta {i}, table_id {int(b.table_ids[i])}"
        )
    bad_r = ~bias & (b.rows >= lim.table_rows[np.where(bias, 0, b.table_ids).astype(np.int64)])
    if bad_r.any():
        i = int(np.argmax(bad_r))
        t = int(b.table_ids[i])
        return (
            f"{int(bad_r.sum())} deltas name rows beyond their table; first: delta {i}, table {t} row "
            f"{int(b.rows[i])} >= {int(lim.table_rows[t])} rows"
        )
    why = lim.codec.check_storable(b.vectors, b.first_order)
    if why is not None:
        return f"a value the store cannot hold ({why})"
    return None


def concat(batches: list[DeltaBatch]) -> DeltaBatch:
    """One batch of the deltas of ``batches`` (same model, version and dim), in order."""
    if len(batches) == 1:
        return batches[0]
    b0 = batches[0]
    return DeltaBatch(
        b0.model,
        b0.model_version,
        b0.dim,
        np.concatenate([b.table_ids for b in batches]),
        np.concatenate([b.rows for b in batches]),
        np.concatenate([b.vectors for b in batches]),
        np.concatenate([b.first_order for b in batches]),
        np.concatenate([b.seqs for b in batches]),
        np.concatenate([b.event_time_ms for b in batches]),
    )


def positions_from_meta(values: list[bytes | None]) -> list[str]:
    """Per-shard recorded positions ("" where none)."""
    return [v.decode("utf-8") if v is not None else "" for v in values]


def lagging_shards(positions: list[str], position: str) -> list[int]:
    """Shards whose recorded position is before ``position`` (they still need it)."""
    return [s for s, p in enumerate(positions) if p < position]


def shard_subset(b: DeltaBatch, shards: int, keep: list[int]) -> dict[int, np.ndarray]:
    """Indices of ``b``'s deltas per shard in ``keep`` (shard -> int indices)."""
    sh = shard_of(b.table_ids, b.rows, shards)
    return {s: np.flatnonzero(sh == s) for s in keep}


# -- the apply loop -------------------------------------------------------------------------------


class Updater:
    def __init__(
        self,
        models_dir: str | Path,
        model: str,
        source: DeltaSource,
        config: UpdaterConfig | None = None,
        *,
        metrics: UpdaterMetrics | None = None,
        **options,
    ) -> None:
        """``config`` (default ``UpdaterConfig()``), with ``options`` (its fields, e.g. ``batch_files=16``)
        on top: ConfigError (a ValueError naming the setting) if any is bad."""
        self.config = (config or UpdaterConfig()).replace(**options)
        self.live = LiveModel(models_dir, model)
        self.source = source
        self._budget_t, self._budget_n = time.monotonic(), 0
        self.metrics = metrics or UpdaterMetrics(model)
        self.positions: dict[bytes, list[str]] = {}  # position key -> per-shard position ("" : none)
        self.blocked: SourceItem | None = None
        self._stop = threading.Event()
        self._pending: list[tuple[SourceItem, DeltaBatch]] = []  # the batch being gathered (step)
        self._pending_rows, self._gather_t0 = 0, 0.0
        self._last_version_check = 0.0
        self._first_seen: dict[tuple[bytes, str], float] = {}  # waiting item -> when this process first saw it
        self.features = FeatureTables(self.live.model_dir)  # feature-row deltas (shared by the versions)
        self.remote_errors = 0  # remote store errors gone through (_reopen_after)
        self._remote_delay = REMOTE_RETRY_S[0]
        self._remote_log = RepeatLimiter(log, REMOTE_LOG_S)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        v = self.live.newest()
        if v is None:
            raise ValueError(
                f"{self.live.model_dir}: no complete version to update (a version is complete "
                "once its manifest.json exists)"
            )
        self.live.open(v)
        self._read_positions()
        lowest = {k: min(p) or None for k, p in self.positions.items()}
        if not any(any(p) for p in self.positions.values()):  # a new store: where its version begins
            lowest = self.source.version_start(self.live.model_dir / str(v)) or lowest
        log.info(
            "recorded positions of %s v%d in %s: %s",
            self.live.name,
            v,
            self.source.describe(),
            _show({k: (lowest.get(k), max(p) or None) for k, p in self.positions.items()}),
        )
        self.source.seek(lowest)
        self._last_version_check = time.monotonic()
        self.metrics.restart_clock()

    def run(self, once: bool = False, max_seconds: float | None = None) -> dict:
        """Apply until :meth:`stop` (or, with ``once``, until nothing more can be applied now)."""
        t_end = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self._stop.is_set():
                if t_end is not None and time.monotonic() > t_end:
                    break
                try:
                    if self.live.store is None:
                        if not self._await_version(once, t_end):
                            break  # stopped (SIGTERM) or out of time before any version came
                        self.start()
                    n = self.step()
                except REMOTE_ERRORS as e:  # a cluster down or failing over, or a fenced batch
                    self._reopen_after(e)
                    continue
                self._remote_delay = REMOTE_RETRY_S[0]
                if n == 0:
                    self.source.wait(self.config.poll_interval_s)  # a new file ends it (inotify, a message)
                    if once and self.step() == 0:  # nothing came in that wait either: drained
                        break
        except OSError as e:  # disk full, I/O error: stop; what was not acked is applied after a restart
            log.error(
                "stopping: %s. Files not yet applied stay in %s and are applied after a restart "
                "(shards that recorded a batch are not written twice)",
                e,
                self.source.describe(),
            )
            self._close_after_error()
            raise
        except BaseException:
            self._close_after_error()
            raise
        self._tick(force=True)
        self.close()
        return self.metrics.summary()

    def _await_version(self, once: bool, t_end: float | None) -> bool:
        """Until MODELS/NAME holds a complete version: True once it does, False if stopped or out of time
        first. An updater may start before its version exists: in a Kubernetes pod the server beside it
        copies the version down from object storage into MODELS while both start (deploy/kubernetes/).
        One log line, and ``offgraph_update_waiting_for_version`` 1 meanwhile. With ``once`` (apply what
        can be applied now) no version is the error it always was (:meth:`start` raises it)."""
        if once or self.live.newest() is not None:
            return True
        every = max(self.config.version_check_s, 0.1)
        log.info(
            "%s: no complete version yet (a version is complete once its manifest.json exists): waiting for "
            "one, looking every %gs",
            self.live.model_dir,
            every,
        )
        self.metrics.waiting_for_version(True)
        t0 = time.monotonic()
        while self.live.newest() is None:
            if self._stop.wait(every) or (t_end is not None and time.monotonic() > t_end):
                return False
        self.metrics.waiting_for_version(False)
        log.info(
            "%s: version %d is there after %.1fs of waiting",
            self.live.model_dir,
            self.live.newest(),
            time.monotonic() - t0,
        )
        return True

    def _reopen_after(self, e: StoreRemoteError | StoreUnavailable) -> None:
        """A remote store's write, read or open did not go through: nothing of the batch was applied, and
        what the store holds may be older than what this process wrote (a failover loses the batches a
        master had not replicated, with their positions). Drop what was gathered, close the store,
        wait (a backoff, up to ``REMOTE_RETRY_S[1]``) and start again: :meth:`start` reads the positions
        the shards hold and seeks the source back to them, so the lost batches are applied again."""
        self.remote_errors += 1
        self.metrics.store_reopened()
        self._remote_log.log(
            logging.WARNING,
            "the store's cluster: %s; reopening it in %.1fs and going on from the positions it holds",
            e,
            self._remote_delay,
            key=type(e).__name__,
        )
        self._pending, self._pending_rows, self._gather_t0 = [], 0, time.monotonic()
        try:
            self.live.close()
        except Exception:  # noqa: BLE001 - a store whose cluster is gone may fail to close; it is dropped
            self.live.store = None
        self._stop.wait(self._remote_delay)
        self._remote_delay = min(2 * self._remote_delay, REMOTE_RETRY_S[1])

    def _close_after_error(self) -> None:
        """Close without hiding the error in flight behind one of closing (a store that hit
        a full disk fails to close too)."""
        try:
            self._tick(force=True)
            self.close()
        except Exception as e:
            log.warning("while closing after the error: %s", e)

    def stop(self) -> None:
        self._stop.set()
        self.source.interrupt()

    def close(self) -> None:
        self.features.close()
        self.live.close()
        self.source.close()

    # ------------------------------------------------------------------ one round
    def step(self) -> int:
        """Apply what the source holds now, in batches cut at ``max_batch_rows`` rows or
        once ``max_batch_delay_s`` was spent gathering, whichever comes first (a lone file is
        applied at once, a flood in big batches); returns the files handled."""
        now = time.monotonic()
        if now - self._last_version_check >= self.config.version_check_s:
            self._last_version_check = now
            self._maybe_switch()
        self.blocked = None
        self._pending, self._pending_rows, self._gather_t0 = [], 0, now
        handled = 0
        while True:
            items = self.source.poll(self.config.batch_files)
            self._tick()  # the backlog as polled, before it is applied (at most every 0.5 s; a long drain polls often)
            handled += self._take(items)
            if self.blocked is not None or len(items) < self.config.batch_files or self._stop.is_set():
                break
            self._flush_pending()  # before polling again: a source returns unacked items again
        self._flush_pending()
        self._tick()
        return handled

    def _tick(self, force: bool = False) -> None:
        if self.metrics.tick(self.source, self.live.version, force=force):
            write_status(
                self.live.model_dir,
                {**self.metrics.status(), "source": self.source.describe(), "wakeup": self.source.wakeup},
            )

    def _flush_pending(self) -> None:
        self._flush(self._pending)
        self._pending, self._pending_rows, self._gather_t0 = [], 0, time.monotonic()

    def _take(self, items: list[SourceItem]) -> int:
        """Check ``items`` and add them to the batch being gathered (flushed whenever it is
        full); returns the files handled (applied or refused)."""
        handled = 0
        for item in items:
            try:
                item.position.encode("utf-8")  # recorded in the store as UTF-8
                batch = item.read()
            except DeltaFormatError as e:
                self._reject(item, f"malformed delta file: {e}")
                handled += 1
                continue
            except UnicodeEncodeError:
                self._reject(item, "the file name is not valid UTF-8 (positions are recorded as UTF-8)")
                handled += 1
                continue
            except FileNotFoundError:
                continue
            except (PermissionError, IsADirectoryError) as e:
                self._reject(item, f"cannot read the file: {e}")
                handled += 1
                continue
            if isinstance(batch, FeatureDeltaBatch):
                self._flush_pending()  # in order: the embedding rows gathered before it go first
                self._apply_features(item, batch)
                handled += 1
                continue
            if batch.appends:  # checked against, and applied after, the appends before it
                self._flush_pending()
            verdict = self._route(item, batch)
            if verdict == SWITCH:
                self._flush_pending()
                self._maybe_switch()
                verdict = self._route(item, batch)
            if verdict == WAIT:
                self.blocked = item
                break
            if verdict != APPLY:
                self._reject(item, verdict)
                handled += 1
                continue
            handled += 1
            shard_pos = self._shard_positions(item.key)
            lag = lagging_shards(shard_pos, item.position)
            if not item.late and len(lag) < len(shard_pos):
                self._flush_pending()  # recovery: some shards already hold this file
                self._apply_to_shards(item, batch, lag)
                continue
            if batch.appends:  # alone: its appends are then the state the next file is checked against
                self._flush([(item, batch)])
                continue
            self._pending.append((item, batch))
            self._pending_rows += len(batch)
            if (
                self._pending_rows >= self.config.max_batch_rows
                or time.monotonic() - self._gather_t0 >= self.config.max_batch_delay_s
            ):
                self._flush_pending()
        return handled

    def _route(self, item: SourceItem, b: DeltaBatch) -> str:
        """APPLY, WAIT, SWITCH, or the reason to refuse ``item``."""
        live = self.live.version
        if b.model != self.live.name:
            return f"addressed to model {b.model!r}; this updater serves {self.live.name!r}"
        if b.model_version < live:
            return (
                f"addressed to model version {b.model_version}, but version {live} is live: deltas for an "
                "old version are refused, not re-targeted (a retrained version has another embedding "
                "space and other rows; the producer must compute deltas against the live version)"
            )
        if b.model_version > live:
            newest = self.live.newest()
            if newest is not None and newest > live:
                return SWITCH
            # waited since this process first saw it (monotonic): a producer's clock or a file's mtime
            # in the future would stall the stream for good
            seen = self._first_seen.setdefault((item.key, item.position), time.monotonic())
            age = time.monotonic() - seen
            if age >= self.config.wait_timeout_s:
                self._first_seen.pop((item.key, item.position), None)
                return (
                    f"addressed to model version {b.model_version}, which is not complete (no manifest) "
                    f"after waiting {age:.0f}s > --wait-timeout {self.config.wait_timeout_s:g}s; live is {live}"
                )
            return WAIT
        self._first_seen.pop((item.key, item.position), None)
        return check_batch(b, self.live.limits) or self.live.appends.refusal(b) or APPLY

    # ------------------------------------------------------------------ writes
    def _flush(self, pending: list[tuple[SourceItem, DeltaBatch]]) -> None:
        if not pending:
            return
        b = concat([x for _, x in pending])
        pos: dict[bytes, str] = {}  # the batch's last position under each key it advances
        for item, _ in pending:
            pos[item.key] = max(pos.get(item.key) or max(self._shard_positions(item.key)), item.position)
        appends = self.live.appends.meta(b)  # a file with appends is flushed alone
        try:
            res = self.live.store.write(
                b.table_ids,
                b.rows,
                b.vectors,
                b.first_order,
                seqs=b.seqs,
                meta={**{k: p.encode() for k, p in pos.items()}, **appends},
                meta_shards="all",
                feed=True,
                sync=self.config.sync,
                durability=self.config.durability,
            )
        except ValueError as e:
            # the store refused a value that no check of _route foresaw (store.write raises
            # ValueError only before it writes anything): find the file alone, apply the rest
            if len(pending) == 1:
                self._reject(pending[0][0], f"the store refused it: {e}")
                return
            log.warning("the store refused a batch of %d files (%s); applying them one by one", len(pending), e)
            for one in pending:
                self._flush([one])
            return
        for k, p in pos.items():
            self.positions[k] = [p] * self.live.store.config.shards
        self.live.appends.commit(b)
        for item, _ in pending:
            self.source.ack(item)
        self._applied(len(pending), res, b)

    def _apply_to_shards(self, item: SourceItem, b: DeltaBatch, shards: list[int]) -> None:
        """Catch-up after a crash between shard batches: only ``shards`` lack ``item``."""
        if shards:
            log.info("%s: re-applying to shards %s only (the others recorded it before a restart)", item.name, shards)
        applied = stale = 0
        shard_pos = self._shard_positions(item.key)
        appends = self.live.appends.meta(b, whole=True)
        for s, idx in shard_subset(b, len(shard_pos), shards).items():
            res = self.live.store.write(
                b.table_ids[idx],
                b.rows[idx],
                b.vectors[idx],
                b.first_order[idx],
                seqs=b.seqs[idx],
                meta={item.key: item.position.encode(), **appends},
                meta_shards=s,
                feed=True,
                sync=self.config.sync,
                durability=self.config.durability,
            )
            shard_pos[s] = item.position
            applied, stale = applied + res.applied, stale + res.skipped_stale
        self.live.appends.commit(b)
        self.metrics.applied(1, len(b), applied, stale, _newest(b))
        self.source.ack(item)

    def _apply_features(self, item: SourceItem, b: FeatureDeltaBatch) -> None:
        """A feature-row delta: refused (dead letters) or written with its position in the same batch."""
        reason = self.features.refusal(b, self.live.name, self.live.spec, self.live.version)
        if reason is not None:
            self._reject(item, reason)
            return
        try:
            res = self.features.apply(b, self.live.spec, item.key, item.position, late=item.late, sync=self.config.sync)
        except FeatureTableError as e:  # e.g. a bulk load holds the table: stop; the file stays unapplied
            raise OSError(str(e)) from None
        if res is None:
            log.info("%s: already in feature table %s (applied before a restart)", item.name, b.table)
        else:
            self.metrics.applied(1, len(b), res[0], res[1], int(b.event_time_ms.max()) if len(b) else None)
        self.source.ack(item)

    def _applied(self, files: int, res, b: DeltaBatch) -> None:
        self.metrics.applied(files, len(b), res.applied, res.skipped_stale, _newest(b))
        self._throttle(len(b))

    def _throttle(self, n: int) -> None:
        """With ``max_deltas_per_s``: sleep so that deltas / time stays under it (the
        budget restarts after an idle second, so a burst is not paid for later)."""
        if self.config.max_deltas_per_s <= 0:
            return
        now = time.monotonic()
        if now - self._budget_t > 1.0 + self._budget_n / self.config.max_deltas_per_s:
            self._budget_t, self._budget_n = now, 0
        self._budget_n += n
        ahead = self._budget_t + self._budget_n / self.config.max_deltas_per_s - now
        if ahead > 0:
            self._stop.wait(ahead)

    def _reject(self, item: SourceItem, reason: str) -> None:
        where = self.source.reject(item, reason)
        self.metrics.dead()
        log.warning("dead-lettered %s -> %s: %s", item.name, where, reason)

    # ------------------------------------------------------------------ versions
    def _read_positions(self) -> None:
        self.positions = {
            k: positions_from_meta(self.live.store.get_meta_per_shard(k)) for k in self.source.position_keys()
        }

    def _shard_positions(self, key: bytes) -> list[str]:
        """Per-shard positions under ``key`` (a key first seen now, e.g. a new partition: none)."""
        if key not in self.positions:
            self.positions[key] = [""] * self.live.store.config.shards
        return self.positions[key]

    def _maybe_switch(self) -> None:
        newest = self.live.newest()
        if newest is None or newest <= self.live.version:
            return
        old = self.live.version
        done = {k: max(max(p), self.source.positions().get(k, "")) for k, p in self.positions.items()}
        done.update({k: p for k, p in self.source.positions().items() if k not in done})
        self.live.open(newest)
        self._read_positions()
        if not any(any(p) for p in self.positions.values()):
            # everything at or before `done` was applied to the old version or refused
            for k, p in done.items():
                if p:
                    self.live.store.put_meta(k, p.encode())
                    self.positions[k] = [p] * self.live.store.config.shards
        log.info(
            "switched %s from version %d to %d; deltas for version %d are refused from now on",
            self.live.name,
            old,
            newest,
            old,
        )


def _show(positions: dict[bytes, tuple]) -> str:
    return (
        ", ".join(
            f"{k.decode(errors='replace')}: lowest {lo}, highest {hi}" for k, (lo, hi) in sorted(positions.items())
        )
        or "none"
    )


def _newest(b: DeltaBatch) -> int | None:
    return int(np.max(b.event_time_ms)) if len(b) else None
