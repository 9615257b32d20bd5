"""The write side of an embedding store: the plan of a ``write`` (seq checks, the feed,
one atomic batch per shard) and meta records.

A mixin of ``base.EmbeddingStore``: it uses the backend's primitives (``backend.StoreBackend``:
``_multi_get``, ``_write_batch``, ``_flush``, ``_iter_values``) and the store's helpers
(``_check_writable``, ``_group_by_shard``, ``_check_shard``). Which input rows win is
``_write_plan`` (NumPy).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from offgraph.store._write_plan import check_seqs, winners
from offgraph.store.feed import FeedReader, FeedWriter
from offgraph.store.internal_keys import (
    RESERVED_META,
    SEQ_END,
    SEQ_PREFIX,
    SEQ_WATERMARK_KEY,
    decode_seq,
    decode_seqs,
    encode_seq,
    seq_key_list,
    seq_value_list,
)
from offgraph.store.keys import META_PREFIX, as_key_arrays, key_array, key_list, shard_of

DURABILITY = ("wal", "flush")

log = logging.getLogger("offgraph.store")


@dataclass(frozen=True)
class WriteResult:
    """What :meth:`EmbeddingStore.write` returns."""

    applied: int  # distinct (table, row) keys written
    skipped_stale: int  # input rows not written: a newer-or-equal seq won (stored, or in the same call)


class StoreWrites:
    """``write`` and ``put_meta`` of ``EmbeddingStore`` (mode ``"w"``), and its write feed."""

    def write(
        self,
        table_ids,
        rows,
        vectors,
        first_order,
        *,
        seqs=None,
        meta: dict[bytes, bytes] | None = None,
        meta_shards: str | int = "all",
        feed: bool = False,
        sync: bool = False,
        durability: str = "wal",
    ) -> WriteResult:
        """Quantize and put rows; ONE atomic batch per shard.

        ``seqs`` (int >= 0 per row, optional): per-row sequence numbers, kept in the
        store (same shard, same atomic batch as the row). Last write wins by seq: a row
        whose stored seq is >= its new seq is skipped (``skipped_stale``), and of
        duplicates of one key in a call the highest seq wins (equal: the first one, as
        across calls).
        Without ``seqs`` the stored seqs are neither read nor changed and a later
        duplicate in the call wins. The read-compare-write of seqs assumes ONE writer
        (one process, writes serialized by a lock), which is what mode ``"w"`` gives.
        Stored seqs are read only for rows whose new seq is at or below the shard's
        watermark (the highest seq it holds, kept in the same atomic batch): producers
        that number updates in increasing order cost no reads.

        ``feed``: feed the followers: the applied rows of all shards go, as ONE batch,
        to the store's write feed (``offgraph.store.feed``) before the first shard batch is
        written, each shard's rows made visible there once the store holds them;
        followers serve fresh rows from the feed, so a writer with followers must set it
        on every write.

        ``meta`` records (small ``bytes -> bytes``, kept in the meta key space, see
        :meth:`get_meta`) go into the SAME atomic batch of the shards named by
        ``meta_shards``: ``"all"`` (every shard, even one without rows: each shard
        then records how far it got), ``"touched"`` (shards that got rows) or a shard
        index.

        A ``ValueError`` (bad arguments or values, e.g. one the record format cannot hold)
        is raised before anything is written; an ``OSError`` (disk full, I/O) may come after
        some shards' batches were written (each shard's batch is atomic).

        ``durability``: ``"wal"`` (default) logs each batch to the write-ahead log
        (``sync`` fsyncs it). ``"flush"`` skips the WAL and flushes each written shard's
        memtable into an SST file before the next shard is written: as durable and as
        atomic per shard (a flush installs its SST in one MANIFEST edit; a crash before it
        loses that shard's batch, its meta records included; a shard that gets meta records
        only is written through the WAL, not flushed), and far cheaper for followers: a
        RocksDB secondary then picks up new SST files instead of replaying the WAL in
        ``try_catch_up_with_primary``, which holds the follower's GIL (the two measured
        against each other: ``bench/results/update-freshness/README.md``).
        """
        self._check_writable()
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {durability!r}")
        wal = durability == "wal"
        t, r = as_key_arrays(table_ids, rows)
        records = self.codec.encode(vectors, first_order)
        if len(records) != len(r):
            raise ValueError(f"got {len(r)} rows but {len(records)} vectors")
        sq = None if seqs is None else check_seqs(seqs, len(r))
        if not isinstance(feed, bool):
            raise ValueError(f"feed must be a bool, got {feed!r}")
        meta_items = self._meta_items(meta)
        S = self.config.shards
        win = winners(t, r, sq)
        skipped = len(r) - len(win) if sq is not None else 0
        t, r, records = t[win], r[win], records[win]
        if sq is not None:
            sq = sq[win]
        groups = self._group_by_shard(shard_of(t, r, S)) if len(r) else []
        if not meta_items:
            meta_targets: set[int] = set()
        elif meta_shards == "all":
            meta_targets = set(range(S))
        elif meta_shards == "touched":
            meta_targets = {s for s, _ in groups}
        else:
            meta_targets = {self._check_shard(meta_shards)}
        rows_by_shard = dict(groups)
        applied = 0
        with self._write_lock:
            # plan every shard's batch first (seq checks included), so that the feed batch
            # holding exactly these rows is staged BEFORE any of them is written (and each
            # shard's rows published once the store holds them: offgraph.store.feed)
            plans: list[tuple[int, list[bytes], list[bytes], int]] = []
            fed_keys: list[bytes] = []
            fed_records: list[np.ndarray] = []
            fed_span: dict[int, tuple[int, int]] = {}  # shard -> its rows in the feed batch
            fed_rows = 0
            new_watermarks: dict[int, int] = {}  # taken in memory once the shard's batch is written
            for s in sorted(set(rows_by_shard) | meta_targets):
                keys: list[bytes] = []
                values: list[bytes] = []
                idx = rows_by_shard.get(s)
                if idx is not None:
                    ka = key_array(t[idx], r[idx])
                    if sq is not None:
                        wm = self._seq_watermark(s)
                        fresh = self._fresh(s, ka, sq[idx], wm)
                        skipped += len(idx) - int(fresh.sum())
                        if not fresh.all():
                            idx, ka = idx[fresh], ka[fresh]
                        if len(idx):
                            keys += seq_key_list(ka)
                            values += seq_value_list(sq[idx])
                            top = max(wm, int(sq[idx].max()))
                            if top > wm:
                                keys.append(SEQ_WATERMARK_KEY)
                                values.append(encode_seq(top))
                                new_watermarks[s] = top
                    if len(idx):
                        keys += key_list(ka)
                        values += _record_list(records[idx])
                        if feed:
                            fed_keys.append(ka.tobytes())
                            fed_records.append(records[idx])
                            fed_span[s] = (fed_rows, fed_rows + len(idx))
                            fed_rows += len(idx)
                if s in meta_targets:
                    keys += [k for k, _ in meta_items]
                    values += [v for _, v in meta_items]
                if keys:
                    plans.append((s, keys, values, 0 if idx is None else len(idx)))
            staged = self._feed_writer().stage(b"".join(fed_keys), np.concatenate(fed_records)) if fed_keys else None
            plans.sort(key=lambda p: p[3] == 0)  # shards with rows first: their rows are published sooner
            for s, keys, values, n_rows in plans:
                # each shard written, flushed and published before the next one is written: a
                # fed row waits for its own shard only, not for every shard's write and the
                # flushes before its own. A shard that gets meta records only (the updater's
                # position in every shard) goes through the WAL instead of a flush: as durable
                # against a crash of this process, and without the flush's fsyncs (else a batch
                # of a few rows would pay one flush per shard)
                meta_only = n_rows == 0
                logged = wal or meta_only
                self._write_batch(s, keys, values, sync and logged, logged)
                applied += n_rows
                if s in new_watermarks:
                    self._seq_watermarks[s] = new_watermarks[s]
                if not logged:
                    self._flush(s)
                if staged is not None and s in fed_span:
                    staged.publish(*fed_span[s])  # in the WAL (survives a crash of this process) or an SST
        return WriteResult(applied, skipped)

    def _fresh(self, s: int, ka: np.ndarray, new: np.ndarray, watermark: int) -> np.ndarray:
        """Which rows of shard ``s`` (keys ``ka``) hold an older seq than ``new``: reads the
        stored seqs of those at or below the watermark only (above it none can be stale)."""
        fresh = new > watermark
        if not fresh.all():
            maybe = np.flatnonzero(~fresh)
            stored = decode_seqs(self._multi_get(s, seq_key_list(ka[maybe])))
            fresh[maybe] = new[maybe] > stored
        return fresh

    def _seq_watermark(self, s: int) -> int:
        """The highest seq shard ``s`` holds (-1: none): its watermark record, or, in a store
        written before the record existed, the maximum over its seq records (read once)."""
        wm = self._seq_watermarks.get(s)
        if wm is None:
            raw = self._multi_get(s, [SEQ_WATERMARK_KEY])[0]
            if raw is not None:
                wm = decode_seq(raw)
            else:
                seqs = decode_seqs(list(self._iter_values(s, SEQ_PREFIX, SEQ_END)))
                wm = int(seqs.max()) if len(seqs) else -1
                if len(seqs):
                    log.info(
                        "%s shard %d: seq watermark %d from %d seq records (a store written before "
                        "watermarks were kept)",
                        self.path,
                        s,
                        wm,
                        len(seqs),
                    )
            self._seq_watermarks[s] = wm
        return wm

    def _feed_writer(self) -> FeedWriter:
        if self._feed is None:
            self._feed = FeedWriter(self.path, self.codec.record_bytes)
        return self._feed

    def feed_reader(self) -> FeedReader:
        """The write feed of this store, for a follower (see ``offgraph.store.feed``)."""
        self._check_open()
        return FeedReader(self.path, self.codec.record_bytes)

    def put_meta(self, key: bytes, value: bytes, shard: int | None = None) -> None:
        """Put one meta record in ``shard`` (every shard if None)."""
        self._check_writable()
        ((k, v),) = self._meta_items({key: value})
        shards = range(self.config.shards) if shard is None else [self._check_shard(shard)]
        for s in shards:
            self._write_batch(s, [k], [v], False)

    def _meta_items(self, meta: dict[bytes, bytes] | None) -> list[tuple[bytes, bytes]]:
        items = []
        for k, v in (meta or {}).items():
            if not isinstance(k, bytes) or not k:
                raise ValueError(f"meta keys must be non-empty bytes, got {k!r}")
            if k.startswith(RESERVED_META):
                raise ValueError(f"meta keys starting with byte 0x00 are reserved for the store, got {k!r}")
            if not isinstance(v, bytes):
                raise ValueError(f"meta values must be bytes, got {type(v).__name__} for {k!r}")
            items.append((META_PREFIX + k, v))
        return items


def _record_list(records: np.ndarray) -> list[bytes]:
    rb = records.shape[1]
    return np.ascontiguousarray(records).view(np.dtype((np.void, rb))).ravel().tolist()
