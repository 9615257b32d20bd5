"""How many read threads a store's misses want: direct random reads of a synth store at 1-16 threads.

The block cache is 2 MiB, so nearly every key is a device read. Rounds are interleaved over the thread
counts, so that the machine's other load hits every count alike. Two measures per count ``T``:

* depth: ``T`` threads, each one ``multi_get`` of ``--batch`` keys of one shard at a time -> keys/s and
  the latency of a call;
* request: one ``read_unique_records`` of ``--keys`` random keys with ``read_threads=T`` -> its wall time.

    python -m bench.read_threads --store out/scale-models/m10000000/scale/1/store --out bench/results/read-threads

Writes ``OUT/read_threads-B{batch}-K{keys}.json`` and ``.png``; ``offgraph.store.config.DEFAULT_READ_THREADS`` is
chosen from them (bench/results/read-threads/README.md).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import numpy as np

from offgraph.modeldir.manifest_model import Manifest
from offgraph.store import StoreConfig, open_store
from offgraph.store.keys import key_array, key_list, shard_of

THREADS = (1, 2, 4, 8, 16)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", required=True, help="a synth version's store directory (table 0 is read)")
    p.add_argument("--out", default="bench/results/read-threads")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--keys", type=int, default=200, help="keys of one request's read")
    p.add_argument("--batch", type=int, default=16, help="keys of one multi_get call in the depth measure")
    args = p.parse_args(argv)
    store = args.store
    base = StoreConfig.from_dict(json.loads((Path(store) / "store.json").read_text())["config"])
    stores = {
        T: open_store(store, base.replace(block_cache_mb=2, read_threads=T, statistics=True), mode="r") for T in THREADS
    }
    if not all(s.io_mode == "direct" for s in stores.values()):
        raise SystemExit(f"{store}: not read with direct I/O here; the figures would be the page cache's")
    manifest = Manifest.from_json((Path(store).parent / "manifest.json").read_text())
    n_rows = manifest.fields[0].rows  # table 0's rows: all in the store after a synth
    lat = {T: [] for T in THREADS}
    keys_done = dict.fromkeys(THREADS, 0)
    busy = dict.fromkeys(THREADS, 0.0)
    req = {T: [] for T in THREADS}
    rng = np.random.default_rng(0)
    for rnd in range(args.rounds):
        for T in THREADS:
            st, stop = stores[T], time.perf_counter() + 0.5
            calls: list[list[tuple[float, int]]] = [[] for _ in range(T)]

            def worker(i: int, st=st, stop=stop, calls=calls, T=T) -> None:
                g = np.random.default_rng(1000 * rnd + 10 * T + i)
                while time.perf_counter() < stop:
                    r = g.integers(0, n_rows, 8 * args.batch).astype(np.uint64)
                    t = np.zeros(len(r), np.uint32)
                    s = shard_of(t, r, base.shards)
                    sel = np.sort(r[s == s[0]][: args.batch])
                    k = key_list(key_array(t[: len(sel)], sel))
                    t0 = time.perf_counter()
                    st._multi_get(int(s[0]), k)
                    calls[i].append((time.perf_counter() - t0, len(k)))

            ths = [threading.Thread(target=worker, args=(i,)) for i in range(T)]
            t0 = time.perf_counter()
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            busy[T] += time.perf_counter() - t0
            for c in calls:
                lat[T].extend(x for x, _ in c)
                keys_done[T] += sum(n for _, n in c)
            for _ in range(4):
                r = np.unique(rng.integers(0, n_rows, args.keys)).astype(np.uint64)
                t0 = time.perf_counter()
                st.read_unique_records(0, r)
                req[T].append(time.perf_counter() - t0)
    out = {}
    for T in THREADS:
        a, q = np.array(lat[T]) * 1e3, np.array(req[T]) * 1e3
        bc = stores[T].block_cache_stats()
        out[T] = dict(
            keys_s=keys_done[T] / busy[T],
            call_p50_ms=float(np.median(a)),
            call_p99_ms=float(np.percentile(a, 99)),
            req_p50_ms=float(np.median(q)),
            req_p99_ms=float(np.percentile(q, 99)),
            block_cache_miss_share=bc["misses"] / max(1, bc["hits"] + bc["misses"]),
        )
        print(
            f"T={T:2d} | {args.batch}-key multi_get per thread: {out[T]['keys_s']:7.0f} keys/s, call p50 "
            f"{out[T]['call_p50_ms']:.3f} p99 {out[T]['call_p99_ms']:.2f} ms | {args.keys}-key read: p50 "
            f"{out[T]['req_p50_ms']:.2f} p99 {out[T]['req_p99_ms']:.2f} ms",
            flush=True,
        )
    for s in stores.values():
        s.close()
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    stem = dest / f"read_threads-B{args.batch}-K{args.keys}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    ax[0].plot(THREADS, [out[T]["keys_s"] for T in THREADS], "-o")
    ax[0].set_xlabel("threads")
    ax[0].set_ylabel(f"keys/s ({args.batch}-key multi_get calls)")
    ax[1].plot(THREADS, [out[T]["req_p50_ms"] for T in THREADS], "-o", label="p50")
    ax[1].plot(THREADS, [out[T]["req_p99_ms"] for T in THREADS], "--o", label="p99")
    ax[1].set_xlabel("read_threads")
    ax[1].set_ylabel(f"{args.keys}-key read (ms)")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    print(f"wrote {stem}.json and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
