"""The read side of an embedding store: rows, seqs, meta records, verification, stats.

A mixin of ``base.EmbeddingStore``: it uses the store's primitives (``_multi_get``,
``_seek_first``, ``_iter_row_keys``, ``_shard_info``) and helpers (``_check_open``,
``_group_by_shard``, ``_executor``).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import StoreReadError
from .internal_keys import decode_seqs, seq_key_list
from .keys import KEY_BYTES, as_key_arrays, key_array, key_list, shard_of, unique_keys
from .verify import expect_rows_in_every_shard, seek_rows


@dataclass(frozen=True)
class ReadResult:
    """What :meth:`EmbeddingStore.read_with_stats` returns (input order)."""

    vectors: np.ndarray  # float32 rows.shape + [D]
    first_order: np.ndarray  # float32 rows.shape
    rows_read: int  # rows.size
    unique_rows: int  # distinct (table, row) pairs looked up
    found_rows: int  # distinct pairs present in the store


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
        """Like :meth:`read`, plus counts for metrics (rows, unique rows, rows found)."""
        self._check_open()
        shape = np.shape(rows)
        t, r = as_key_arrays(table_ids, rows, allow_nd=True)
        ut, ur, inv = unique_keys(t, r)
        vec, w, found = self._read_keys(ut, ur)
        return ReadResult(
            vec[inv].reshape(shape + (self.config.dim,)),
            w[inv].reshape(shape),
            len(r),
            len(ur),
            int(found.sum()),
        )

    def read_unique(self, table_ids, rows, parallel: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """No de-duplication (for callers that already did it): ``(vectors,
        first_order, found bool [K])`` in input order. ``parallel=False``: the shards are read one
        after another on the calling thread, not by the read pool (a background job that must not
        take every CPU while requests are served)."""
        self._check_open()
        t, r = as_key_arrays(table_ids, rows)
        return self._read_keys(t, r, parallel)

    def _read_keys(self, t: np.ndarray, r: np.ndarray, parallel: bool = True):
        n, dim, rb = len(r), self.config.dim, self.codec.record_bytes
        vec = np.zeros((n, dim), dtype=np.float32)
        w = np.zeros(n, dtype=np.float32)
        found = np.zeros(n, dtype=bool)
        if n == 0:
            return vec, w, found
        groups = self._group_by_shard(shard_of(t, r, self.config.shards))
        order = np.concatenate([idx for _, idx in groups])
        keys = key_list(key_array(t[order], r[order]))
        jobs, start = [], 0
        for s, idx in groups:
            jobs.append((s, keys[start : start + len(idx)]))
            start += len(idx)
        if len(jobs) == 1 or self.config.read_threads == 1 or not parallel:
            results = [self._multi_get(s, k) for s, k in jobs]
        else:
            results = list(self._executor().map(lambda job: self._multi_get(*job), jobs))
        values = [v for res in results for v in res]
        n_missing = values.count(None)
        if n_missing == 0:
            hit_pos = order
        else:
            hit_pos = order[np.array(values, dtype=object) != None]  # noqa: E711 (elementwise)
        if len(hit_pos) == 0:
            return vec, w, found
        buf = b"".join(v for v in values if v is not None)
        if len(buf) != rb * len(hit_pos):
            raise StoreReadError(
                f"store {self.path!r} holds records whose size is not {rb} bytes "
                f"({self.config.quant}, dim {dim}): wrong config or corrupt store", "bad record size"
            )
        dv, dw = self.codec.decode(np.frombuffer(buf, dtype=np.uint8).reshape(-1, rb))
        vec[hit_pos] = dv
        w[hit_pos] = dw
        found[hit_pos] = True
        return vec, w, found

    def verify_sample(self, table_rows: dict[int, int], max_reads: int = 4096,
                      between: Callable[[], None] | None = None) -> dict[str, int]:
        """Read real rows of every table from every shard, spread so that a small store has every
        data block read and a big one a sample of at most ~``max_reads`` seeks (``embstore.verify``);
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
                        raise StoreReadError(f"store {self.path!r}: shard {s} holds no row of table {t} "
                                             f"({table_rows[t]} rows over {shards} shards): missing data",
                                             f"shard {s} misses table {t}")
                    continue
                if any(len(v) != rb for v in values):
                    raise StoreReadError(f"store {self.path!r}: shard {s}, table {t}: a record is not "
                                         f"{rb} bytes ({self.config.quant}, dim {self.config.dim})",
                                         "bad record size")
                vec, w = self.codec.decode(np.frombuffer(b"".join(values), np.uint8).reshape(-1, rb))
                if not (np.isfinite(vec).all() and np.isfinite(w).all()):
                    raise StoreReadError(f"store {self.path!r}: shard {s}, table {t}: non-finite values",
                                         "non-finite values")
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
        every key when ``exact``; otherwise only RocksDB's estimate of keys is given."""
        self._check_open()
        shards = [{"shard": s, **self._shard_info(s)} for s in range(self.config.shards)]
        out: dict[str, Any] = {
            "backend": self.backend,
            "path": self.path,
            "mode": self.mode,
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
