"""The read side of an embedding store: rows, seqs, meta records, verification, stats.

A mixin of ``base.EmbeddingStore``: it uses the backend's primitives (``backend.StoreBackend``:
``_multi_get``, ``_seek_first``, ``_iter_row_keys``, ``_shard_info``) and the store's helpers
(``_check_open``, ``_group_by_shard``, ``_executor``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from offgraph.store.errors import StoreReadError
from offgraph.store.internal_keys import decode_seqs, seq_key_list
from offgraph.store.keys import KEY_BYTES, as_key_arrays, key_array, key_list, shard_of, unique_keys
from offgraph.store.verify import expect_rows_in_every_shard, seek_rows

MIN_CHUNK_KEYS = 16
"""The fewest keys one ``multi_get`` of a parallel read gets: splitting a small read further costs
more in calls and thread hand-offs than the reads in flight save."""


@dataclass(frozen=True)
class ReadResult:
    """What :meth:`EmbeddingStore.read_with_stats` returns (input order)."""

    vectors: np.ndarray  # float32 rows.shape + [D]
    first_order: np.ndarray  # float32 rows.shape
    rows_read: int  # rows.size
    unique_rows: int  # distinct (table, row) pairs looked up
    found_rows: int  # distinct pairs present in the store
    read_seconds: float  # wall time of the store read (all its multi_get calls, in parallel)


class StoreReads:
    """The reads of ``EmbeddingStore`` (any mode; thread-safe)."""

    def read(self, table_ids, rows) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``(table_ids[i], rows[i])`` in input order.

        ``rows``: int array of any shape ``R`` (e.g. ``[K]`` or ``[N, F]``);
        ``table_ids``: a scalar or an array broadcasting to ``R`` (e.g. ``[F]``).
        Returns ``(vectors float32 R + [D], first_order float32 R)``; rows absent
        from the store read as zeros. Duplicates are looked up once.
        """
        res = self.read_with_stats(table_ids, rows)
        return res.vectors, res.first_order

    def read_with_stats(self, table_ids, rows) -> ReadResult:
        """Like :meth:`read`, plus counts for metrics (rows, unique rows, rows found) and the read's wall time."""
        self._check_open()
        shape = np.shape(rows)
        t, r = as_key_arrays(table_ids, rows, allow_nd=True)
        ut, ur, inv = unique_keys(t, r)
        t0 = time.perf_counter()
        vec, w, found = self._read_keys(ut, ur)
        return ReadResult(
            vec[inv].reshape(shape + (self.config.dim,)),
            w[inv].reshape(shape),
            len(r),
            len(ur),
            int(found.sum()),
            time.perf_counter() - t0,
        )

    def read_unique(self, table_ids, rows, parallel: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """No de-duplication (for callers that already did it): ``(vectors,
        first_order, found bool [K])`` in input order. ``parallel=False``: the shards are read one
        after another on the calling thread, not by the read pool (a background job that must not
        take every CPU while requests are served)."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        return self._read_keys(t, r, parallel)

    def read_unique_records(self, table_ids, rows, parallel: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The stored records of ``(table_ids[i], rows[i])``, not decoded: ``(records uint8
        [K, codec.record_bytes], found bool [K])`` in input order; a row absent from the store has
        an all-zero record. No de-duplication. ``parallel``: as in :meth:`read_unique` (for a cache
        that keeps rows in the store's quantized form)."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        return self._read_records(t, r, parallel)

    def _read_keys(self, t: np.ndarray, r: np.ndarray, parallel: bool = True):
        """``(vectors, first_order, found)`` of validated keys: the records, then ``codec.decode``."""
        records, found = self._read_records(t, r, parallel)
        n = len(r)
        if found.all():
            vec, w = self.codec.decode(records)
            return vec, w, found
        vec = np.zeros((n, self.config.dim), dtype=np.float32)
        w = np.zeros(n, dtype=np.float32)
        if found.any():
            vec[found], w[found] = self.codec.decode(records[found])
        return vec, w, found

    def _read_records(self, t: np.ndarray, r: np.ndarray, parallel: bool = True):
        rb = self.codec.record_bytes
        records = np.zeros((len(r), rb), dtype=np.uint8)
        found = np.zeros(len(r), dtype=bool)
        if len(r) == 0:
            return records, found

        def read(chunk: tuple[int, np.ndarray]) -> None:  # fills its own positions of the outputs
            s, pos = chunk
            values = self._multi_get(s, key_list(key_array(t[pos], r[pos])))
            if values.count(None):
                hit = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
                pos = pos[hit]
                values = [v for v in values if v is not None]
            if not values:
                return
            buf = b"".join(values)
            if len(buf) != rb * len(values):
                raise StoreReadError(
                    f"store {self.path!r} holds records whose size is not {rb} bytes "
                    f"({self.config.quant}, dim {self.config.dim}): wrong config or corrupt store",
                    "bad record size",
                )
            records[pos] = np.frombuffer(buf, dtype=np.uint8).reshape(-1, rb)
            found[pos] = True

        chunks = self._read_chunks(t, r, parallel)
        if len(chunks) == 1 or not parallel or self.config.read_threads == 1:
            deque(map(read, chunks), maxlen=0)
        else:
            deque(self._executor().map(read, chunks), maxlen=0)
        return records, found

    def _read_chunks(self, t: np.ndarray, r: np.ndarray, parallel: bool) -> list[tuple[int, np.ndarray]]:
        """``[(shard, positions)]``: the keys grouped by shard, each shard's keys in key order and
        split into pieces of about ``MIN_CHUNK_KEYS`` or more so that a read has about ``read_threads``
        ``multi_get`` calls in flight (one call reads its keys one after another, and a disk serves
        several random reads at once). Not ``parallel`` (or one read thread): one call per shard."""
        ways = self.config.read_threads if parallel else 1
        size = max(MIN_CHUNK_KEYS, -(-len(r) // ways)) if ways > 1 else len(r)
        chunks = []
        for s, idx in self._group_by_shard(shard_of(t, r, self.config.shards)):
            idx = idx[np.lexsort((r[idx], t[idx]))]  # key order: neighbouring keys share blocks
            chunks.extend((s, piece) for piece in np.array_split(idx, max(1, round(len(idx) / size))))
        return chunks

    def verify_sample(
        self, table_rows: dict[int, int], max_reads: int = 4096, between: Callable[[], None] | None = None
    ) -> dict[str, int]:
        """Read real rows of every table from every shard, spread so that a small store has every
        data block read and a big one a sample of at most ~``max_reads`` seeks (``offgraph.store.verify``);
        the block cache is left as it was. ``table_rows``: table id -> rows (all of ``0..rows-1``
        are in the store, as after an export). Raises StoreReadError on a read that fails (RocksDB
        checks each block's checksum), a record of the wrong size or with a non-finite value, or a
        shard that holds no row of a table it must hold rows of. ``between`` is called after each
        (shard, table) chunk of seeks (a server loading a version while another serves paces itself
        there: seeks hold the GIL). Returns ``{"seeks", "rows_read"}``."""
        self._check_open()
        rb, shards = self.codec.record_bytes, self.config.shards
        plan = seek_rows(table_rows, shards, rb, self.config.block_size_kb << 10, max_reads)
        seeks = rows_read = 0
        for s in range(shards):
            for t, rows in plan.items():
                upper = key_list(key_array(np.array([t], np.int64), np.array([table_rows[t]], np.int64)))[0]
                found = self._seek_first(s, key_list(key_array(np.full(len(rows), t, np.int64), rows)))
                seeks += len(rows)
                values = [v for kv in found if kv is not None and kv[0] < upper for v in kv[1:]]
                if not values:
                    if expect_rows_in_every_shard(int(table_rows[t]), shards):
                        raise StoreReadError(
                            f"store {self.path!r}: shard {s} holds no row of table {t} "
                            f"({table_rows[t]} rows over {shards} shards): missing data",
                            f"shard {s} misses table {t}",
                        )
                    continue
                if any(len(v) != rb for v in values):
                    raise StoreReadError(
                        f"store {self.path!r}: shard {s}, table {t}: a record is not "
                        f"{rb} bytes ({self.config.quant}, dim {self.config.dim})",
                        "bad record size",
                    )
                vec, w = self.codec.decode(np.frombuffer(b"".join(values), np.uint8).reshape(-1, rb))
                if not (np.isfinite(vec).all() and np.isfinite(w).all()):
                    raise StoreReadError(
                        f"store {self.path!r}: shard {s}, table {t}: non-finite values", "non-finite values"
                    )
                rows_read += len(values)
                if between is not None:
                    between()
        return {"seeks": seeks, "rows_read": rows_read}

    def row_seqs(self, table_ids, rows) -> np.ndarray:
        """Stored sequence numbers of ``(table_ids[i], rows[i])`` (int64 [K]; -1 where
        none is stored). One ``multi_get`` per shard."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        out = np.full(len(r), -1, dtype=np.int64)
        if len(r) == 0:
            return out
        for s, idx in self._group_by_shard(shard_of(t, r, self.config.shards)):
            out[idx] = decode_seqs(self._multi_get(s, seq_key_list(key_array(t[idx], r[idx]))))
        return out

    def get_meta(self, key: bytes, shard: int = 0) -> bytes | None:
        """The meta record ``key`` of ``shard`` (None if absent)."""
        self._check_open()
        ((k, _),) = self._meta_items({key: b""})
        return self._multi_get(self._check_shard(shard), [k])[0]

    def get_meta_per_shard(self, key: bytes) -> list[bytes | None]:
        """The meta record ``key`` of every shard, by shard index."""
        self._check_open()
        ((k, _),) = self._meta_items({key: b""})
        return [self._multi_get(s, [k])[0] for s in range(self.config.shards)]

    def stats(self, exact: bool = False) -> dict[str, Any]:
        """Sizes and counts. ``rows_per_table`` (table id -> rows) is exact and scans
        every key when ``exact``; otherwise only the backend's estimate of keys is given."""
        self._check_open()
        shards = [{"shard": s, **self._shard_info(s)} for s in range(self.config.shards)]
        out: dict[str, Any] = {
            "backend": self.backend,
            "path": self.path,
            "mode": self.mode,
            "io_mode": self.io_mode,
            "config": self.config.to_dict(),
            "record": self.codec.describe(),
            "shards": shards,
            "bytes_on_disk": sum(x["bytes_on_disk"] for x in shards),
            "estimated_keys": sum(x["estimated_keys"] for x in shards),
            "rows_per_table": None,
        }
        if exact:
            counts: dict[int, int] = {}
            for s in range(self.config.shards):
                for tid, c in _count_tables(self._iter_row_keys(s)).items():
                    counts[tid] = counts.get(tid, 0) + c
            out["rows_per_table"] = dict(sorted(counts.items()))
        return out


def _count_tables(keys: Iterable[bytes], batch: int = 1 << 20) -> dict[int, int]:
    """Row count per table id of a stream of row keys (vectorized per batch)."""
    counts: dict[int, int] = {}
    buf: list[bytes] = []

    def drain() -> None:
        tids = np.frombuffer(b"".join(k[:4] for k in buf), dtype=">u4")
        u, c = np.unique(tids, return_counts=True)
        for tid, n in zip(u.tolist(), c.tolist()):
            counts[tid] = counts.get(tid, 0) + n
        buf.clear()

    for k in keys:
        if len(k) != KEY_BYTES:
            raise ValueError(f"unexpected key {k!r} in row key space")
        buf.append(k)
        if len(buf) >= batch:
            drain()
    if buf:
        drain()
    return counts
