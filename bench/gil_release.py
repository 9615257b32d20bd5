"""Whether a request's TensorFlow call and its store reads let another thread run Python meanwhile.

A scoring thread of ``offgraph serve`` spends part of each request in the dense head's TensorFlow call
and in the store read of its row-cache misses. Where those release the GIL, the server's other threads
(the event loop decoding the next body, a second scoring thread) run at the same time. Per part,
alternated over ``--rounds``:

* ``alone``: the part run ``--calls`` times on one thread (wall seconds);
* ``spin``: a pure-Python loop of fixed work on one thread (it holds the GIL throughout);
* ``both``: the two at once on two threads.

``overlap = (alone + spin - both) / min(alone, spin)``: 1 when the part never held the GIL (the two ran
side by side), 0 when it held it throughout (they ran one after the other). A pure-Python part (the FG
of the same request) is the control, and should read near 0; ``time.sleep`` reads near 1. Needs two free
cores to read near 1 (a part that keeps both cores busy reads 0 whatever it does with the GIL).

    python -m bench.gil_release --model-dir MODELS/NAME --data movielens.parquet --out bench/results/gil-release

Writes ``OUT/gil_release.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np


def _spin(units: int) -> None:
    x = 0
    for i in range(units):
        x ^= i
    return None


def _wall(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


def _together(fn, calls: int, units: int) -> float:
    """Wall seconds of ``fn`` x ``calls`` on a thread while this thread spins ``units``."""
    t = threading.Thread(target=_wall, args=(fn, calls))
    t0 = time.perf_counter()
    t.start()
    _spin(units)
    t.join()
    return time.perf_counter() - t0


SWITCH_INTERVAL_S = 5e-5
"""The GIL's switch interval while measuring: with Python's default (5 ms) a part that released the GIL waits
up to that long to take it back from the spinning thread after each call, and a part that releases it reads
as one that does not (time.sleep reads ~0.3 instead of ~1)."""


def measure(parts: dict, calls: int, rounds: int) -> dict:
    """Per part: median alone / spin / both seconds over ``rounds`` and the overlap they give."""
    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        return _measure(parts, calls, rounds)
    finally:
        sys.setswitchinterval(old_interval)


def _measure(parts: dict, calls: int, rounds: int) -> dict:
    units: dict[str, int] = {}
    for name, fn in parts.items():  # each part's spin is set to take about as long as the part alone
        alone, u = _wall(fn, calls), 20_000
        while _wall(lambda: _spin(u), 1) < alone:
            u *= 2
        units[name] = u
    out: dict = {}
    samples: dict[str, dict[str, list[float]]] = {p: {"alone": [], "spin": [], "both": []} for p in parts}
    for _ in range(rounds):
        for name, fn in parts.items():  # interleaved: the machine's other load hits every part alike
            s, u = samples[name], units[name]
            s["alone"].append(_wall(fn, calls))
            s["spin"].append(_wall(lambda: _spin(u), 1))  # noqa: B023 - called at once
            s["both"].append(_together(fn, calls, u))
    for name, s in samples.items():
        med = {k: float(np.median(v)) for k, v in s.items()}
        med["overlap"] = (med["alone"] + med["spin"] - med["both"]) / min(med["alone"], med["spin"])
        med["ms_per_call"] = med["alone"] / calls * 1e3
        out[name] = med
    return out


def _parts(model_dir: str, data: str, n: int):
    """The parts of one real N-candidate MovieLens request: the TF call, the store read of its rows (no row
    cache: every row from RocksDB), and its FG (pure Python and NumPy: the control)."""
    import pyarrow.parquet as pq

    import offgraph
    from offgraph.scoring.batch import batch_keys
    from offgraph.server.process.compute_threads import configure_tf_threads

    configure_tf_threads(1, 1)
    scorer = offgraph.load(model_dir)
    spec = scorer.spec
    t = pq.read_table(data).to_pydict()
    req_in, item_in = spec.raw_inputs("request"), spec.raw_inputs("item")
    items: dict = {}
    for i, key in enumerate(t[spec.item_key]):
        items.setdefault(key, {c: t[c][i] for c in item_in})
    pool = list(items.values())
    cands = [pool[j % len(pool)] for j in range(n)]
    request = {c: t[c][0] for c in req_in}
    segments, stats = scorer._segments(request, cands)  # noqa: SLF001 - the scorer's own phases, apart
    batch = scorer.features(request, cands, grouped=True)
    keys = batch_keys(batch)

    def tf_call():
        scorer._dense_segments(segments, stats["dense"])  # noqa: SLF001

    def store_read():
        scorer.store.read_unique_records(keys.unique_tables, keys.unique_rows)

    def fg():
        scorer.features(request, cands, grouped=True)

    return scorer, {"tf_call": tf_call, "store_read": store_read, "fg_control": fg}, len(keys.unique_rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, help="a model directory (its newest version is used)")
    p.add_argument("--data", required=True, help="the model's data (MovieLens parquet): real requests")
    p.add_argument("--out", default="bench/results/gil-release")
    p.add_argument("--candidates", type=int, default=1000)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    scorer, parts, unique_rows = _parts(args.model_dir, args.data, args.candidates)
    with scorer:
        for fn in parts.values():  # warm-up
            fn()
        res = measure(parts, args.calls, args.rounds)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": os.getloadavg()[0]},
        "settings": {**vars(args), "unique_rows": unique_rows},
        "parts": res,
    }
    (out / "gil_release.json").write_text(json.dumps(doc, indent=1))
    print(f"N={args.candidates} ({unique_rows} unique rows), {args.calls} calls x {args.rounds} rounds, medians:")
    for name, r in res.items():
        print(
            f"  {name:12s} {r['ms_per_call']:7.3f} ms/call  alone {r['alone']:.3f}s spin {r['spin']:.3f}s "
            f"both {r['both']:.3f}s  overlap {r['overlap']:.2f}"
        )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = list(res)
    ax.bar(names, [res[k]["overlap"] for k in names], color=["tab:blue", "tab:green", "tab:gray"][: len(names)])
    ax.axhline(1.0, color="k", lw=0.6, ls="--")
    ax.set_ylim(-0.1, 1.2)
    ax.set_ylabel("overlap with a Python thread (1 = GIL released)")
    ax.set_title(f"N={args.candidates}: which parts release the GIL")
    fig.tight_layout()
    fig.savefig(out / "gil_release.png", dpi=110)
    print(f"wrote {out / 'gil_release.json'} and {out / 'gil_release.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
