"""The write feed (``offgraph.store.feed``) against LMDB as the one-writer / many-reader table.

    pip install lmdb        # (or: pip install -e '.[bench]'); not a runtime dependency
    python -m bench.feed_vs_lmdb [--keys 1000000] [--batch 10000] [--lookup 700] [--seconds 10] [--out FILE.json]

Could LMDB (barriers, MVCC, crash safety on every CPU) replace the custom feed table? Each backend, in turn, under the same load: one writer PROCESS puts
batches of ``--batch`` random keys of a ``--keys`` key space (prefilled first), as fast as it
can, for ``--seconds``; one reader PROCESS meanwhile looks up batches of ``--lookup`` random
keys (a request's rows) back to back. Both files live in ``/dev/shm``. Reported: writer rows/s
(while the reader reads) and reader lookup p50/p99/max (ms), printed and written as JSON.

- feed: ``FeedWriter.append`` (stage + publish, no RocksDB here) / ``FeedReader.lookup``
  (``refresh`` every 50 ms, as a follower polls);
- LMDB: one write transaction per batch (``Cursor.putmulti``, keys = 8-byte big-endian
  combined keys (``offgraph.store.keys.combine_keys``), ``sync=False``: crash-safe for a process, which is what the feed
  needs, the store being RocksDB) / one read transaction per lookup (``Cursor.getmulti``).

This is a micro-benchmark: it does not replace the comparison on ``bench/update_freshness.py``
(freshness and scoring p99 through the whole server), which is not done.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import time

import numpy as np


def _keys(rng, n: int, space: int) -> np.ndarray:
    return np.unique(rng.integers(0, space, n).astype(np.uint64))  # table 0: the row is the key


def _records(n: int, rb: int, v: int) -> np.ndarray:
    return np.full((n, rb), v & 0xFF, np.uint8)


class Feed:
    def __init__(self, path: str, rb: int, writer: bool):
        from offgraph.store.feed import FeedReader, FeedWriter
        from offgraph.store.keys import key_array

        self.key_array = key_array
        self.w = FeedWriter(path, rb) if writer else None
        self.r = None if writer else FeedReader(path, rb)
        self._refreshed = 0.0

    def put(self, k: np.ndarray, recs: np.ndarray) -> None:
        self.w.append(self.key_array(np.zeros(len(k), np.uint32), k).tobytes(), recs)

    def get(self, k: np.ndarray) -> int:
        now = time.monotonic()
        if now - self._refreshed >= 0.05:
            self.r.refresh()
            self._refreshed = now
        pos, _ = self.r.lookup(k)
        return len(pos)

    def close(self) -> None:
        (self.w or self.r).close()


class Lmdb:
    def __init__(self, path: str, rb: int, writer: bool):
        import lmdb

        self.env = lmdb.open(
            os.path.join(path, "lmdb"), map_size=1 << 34, sync=False, metasync=False, readahead=False, max_readers=16
        )
        self.rb = rb

    def put(self, k: np.ndarray, recs: np.ndarray) -> None:
        kb = k.astype(">u8").tobytes()
        rb = recs.tobytes()
        # py-lmdb takes Python (key, value) pairs: this per-row loop is part of LMDB's cost from Python
        items = [(kb[8 * i : 8 * i + 8], rb[self.rb * i : self.rb * (i + 1)]) for i in range(len(k))]
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def get(self, k: np.ndarray) -> int:
        kb = k.astype(">u8").tobytes()
        with self.env.begin() as txn:
            got = txn.cursor().getmulti([kb[8 * i : 8 * i + 8] for i in range(len(k))])
        recs = np.frombuffer(b"".join(v for _, v in got), np.uint8).reshape(-1, self.rb)
        return len(recs)

    def close(self) -> None:
        self.env.close()


BACKENDS = {"feed": Feed, "lmdb": Lmdb}


def _writer(kind, path, args, ready, go, stop, out) -> None:
    t = BACKENDS[kind](path, args.record_bytes, writer=True)
    rng = np.random.default_rng(1)
    allk = np.arange(args.keys, dtype=np.uint64)
    for i in range(0, args.keys, args.batch):  # prefill: every lookup finds its rows
        t.put(allk[i : i + args.batch], _records(len(allk[i : i + args.batch]), args.record_bytes, 1))
    ready.set()
    go.wait()
    rows, v, t0 = 0, 2, time.perf_counter()
    while not stop.is_set():
        k = _keys(rng, args.batch, args.keys)
        t.put(k, _records(len(k), args.record_bytes, v))
        rows += len(k)
        v += 1
    out.put(("writer", rows / (time.perf_counter() - t0)))
    t.close()


def _reader(kind, path, args, ready, go, stop, out) -> None:
    t = BACKENDS[kind](path, args.record_bytes, writer=False)
    rng = np.random.default_rng(2)
    ready.set()
    go.wait()
    lat, found = [], 0
    while not stop.is_set():
        k = _keys(rng, args.lookup, args.keys)
        t0 = time.perf_counter()
        found += t.get(k)
        lat.append(time.perf_counter() - t0)
        assert found > 0
    t.close()
    out.put(("reader", lat))


def run(kind: str, args) -> dict:
    path = tempfile.mkdtemp(prefix=f"offgraph-bench-{kind}-", dir=args.dir)
    ctx = mp.get_context("spawn")
    stop, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    w_ready, r_ready = ctx.Event(), ctx.Event()
    w = ctx.Process(target=_writer, args=(kind, path, args, w_ready, go, stop, out))
    try:
        w.start()
        if not w_ready.wait(300):
            raise RuntimeError(f"{kind}: the writer did not prefill within 300 s")
        r = ctx.Process(target=_reader, args=(kind, path, args, r_ready, go, stop, out))
        r.start()
        if not r_ready.wait(60):
            raise RuntimeError(f"{kind}: the reader did not start within 60 s")
        go.set()
        time.sleep(args.seconds)
        stop.set()
        got = dict(out.get(timeout=120) for _ in range(2))
        w.join(60)
        r.join(60)
    finally:
        for p in (w, locals().get("r")):
            if p is not None and p.is_alive():
                p.kill()
        feed_dir = None
        if kind == "feed":
            from offgraph.store.feed import feed_dir as fd

            feed_dir = fd(path)
        shutil.rmtree(path, ignore_errors=True)
        if feed_dir is not None:
            shutil.rmtree(feed_dir, ignore_errors=True)
    lat_ms = 1e3 * np.asarray(got["reader"])
    return {
        "writer_rows_per_s": round(got["writer"]),
        "lookups": len(lat_ms),
        "lookup_p50_ms": round(float(np.percentile(lat_ms, 50)), 4),
        "lookup_p99_ms": round(float(np.percentile(lat_ms, 99)), 4),
        "lookup_max_ms": round(float(lat_ms.max()), 4),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000, help="key space (prefilled)")
    ap.add_argument("--batch", type=int, default=10_000, help="rows per writer batch")
    ap.add_argument("--lookup", type=int, default=700, help="keys per reader lookup")
    ap.add_argument("--record-bytes", type=int, default=68, help="68: fp32 records of D = 16")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured time per backend")
    ap.add_argument("--dir", default="/dev/shm", help="where the files go (memory-backed)")
    ap.add_argument("--backends", default="feed,lmdb")
    ap.add_argument("--out", help="write the figures here as JSON too")
    args = ap.parse_args(argv)
    for name, v, lo in (
        ("--keys", args.keys, 1),
        ("--batch", args.batch, 1),
        ("--lookup", args.lookup, 1),
        ("--record-bytes", args.record_bytes, 1),
        ("--seconds", args.seconds, 0.1),
    ):
        if not v >= lo:
            raise SystemExit(f"feed_vs_lmdb: {name} must be >= {lo}, got {v}")
    kinds = [k for k in args.backends.split(",") if k]
    bad = [k for k in kinds if k not in BACKENDS]
    if bad:
        raise SystemExit(f"feed_vs_lmdb: unknown backend(s) {bad}; choose from {sorted(BACKENDS)}")
    res = {
        "params": {k: getattr(args, k) for k in ("keys", "batch", "lookup", "record_bytes", "seconds")},
        "cpus": os.cpu_count(),
    }
    for kind in kinds:
        res[kind] = run(kind, args)
        print(
            f"{kind:5s}  writer {res[kind]['writer_rows_per_s']:>10,} rows/s   lookup of {args.lookup}: "
            f"p50 {res[kind]['lookup_p50_ms']:.3f} ms  p99 {res[kind]['lookup_p99_ms']:.3f} ms  "
            f"max {res[kind]['lookup_max_ms']:.3f} ms  ({res[kind]['lookups']} lookups)",
            flush=True,
        )
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
