"""Two replicas fed by one Kafka topic: throughput, freshness on both, convergence under SIGKILL.

    python -m bench.kafka_replicas --model-src out/demo/models/movielens/1 --data out/demo/data/movielens.parquet \\
        [--deltas 1000000] [--rate 60000] [--live-seconds 60] [--out kafka_replicas.json]   # + .png

A Tansu broker (``offgraph.testing.tansu``) on loopback; a topic of ``--partitions`` (4). Each replica
is its own copy of the exported version, its own `offgraph update --source kafka://...` and,
in phase 3, its own `offgraph serve`. Deltas draw rows uniformly (the probe request's rows
excepted) and carry one increasing seq counter, so the expected final state of a row is its
last produced value.

1. one replica alone drains ``--deltas`` pre-produced deltas: rows/s (acceptance >= 200k);
2. ``--deltas`` more are produced while the first replica is stopped; then it and a second
   replica, started from the version directory (``stream-start.json``: it reads both
   phases), drain at once (rows/s of each); the second one is SIGKILLed halfway through
   its backlog and restarted;
3. both serve; a live stream of ``--rate`` deltas/s for ``--live-seconds``; every
   ``--probe-every`` s a one-row delta for the probe request's user row is produced and
   both servers are scored until both changed: delta produced -> score changed on each
   replica, p50/p99 over all probes (acceptance p99 <= 1 s over >= 200 probes);
4. the stream stops, both catch up; their rows are compared, byte for byte (every row of
   every table and its seq), with each other and with the expected state.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.lib.client import metric_value
from bench.lib.freshness import HttpScorer, open_bench_model, outside
from bench.lib.server import start_appending, stop_process
from bench.lib.stats import percentiles_ms
from offgraph.testing.harness import free_port, wait_ready

NAME = "ml"
TOPIC = "deltas"


class Producer:
    """Deltas of uniformly drawn rows (``exclude``'s never: table id -> rows), one seq counter, the expected
    final state kept per row (the last produced value: seqs only grow)."""

    def __init__(self, broker: str, table_rows: np.ndarray, dim: int, exclude: dict, partitions: int):
        from offgraph.streaming.kafka.sink import KafkaSink

        self.sink = KafkaSink(f"kafka://{broker}/{TOPIC}", partitions=partitions)
        self.table_rows, self.dim = table_rows, dim
        self.offset = np.concatenate([[0], np.cumsum(table_rows)])
        self.exclude = exclude
        self.rng = np.random.default_rng(0)
        self.seq = 1
        self.final_v = np.zeros((int(self.offset[-1]), dim), np.float32)
        self.final_w = np.zeros(int(self.offset[-1]), np.float32)
        self.final_seq = np.full(int(self.offset[-1]), -1, np.int64)
        self.rows = 0
        self.lock = threading.Lock()

    def delta(self, t, r, v, w) -> dict:
        with self.lock:
            seqs = np.arange(self.seq, self.seq + len(r), dtype=np.int64)
            self.seq += len(r)
            flat = self.offset[t] + r
            self.final_v[flat], self.final_w[flat], self.final_seq[flat] = v, w, seqs  # rows are distinct
            self.rows += len(r)
        return {
            "model": NAME,
            "model_version": 1,
            "table_ids": t,
            "rows": r,
            "vectors": v,
            "first_order": w,
            "seqs": seqs,
            "event_time_ms": int(time.time() * 1000),
        }

    def random_rows(self, k: int):
        p = self.table_rows / self.table_rows.sum()
        t = self.rng.choice(len(self.table_rows), k, p=p).astype(np.uint32)
        r = (self.rng.random(k) * self.table_rows[t]).astype(np.int64)
        keep = outside(t, r, self.exclude)
        t, r = t[keep], r[keep]
        _, first = np.unique(self.offset[t] + r, return_index=True)  # distinct rows within one delta
        return t[first], r[first]

    def emit_random(self, k: int) -> int:
        t, r = self.random_rows(k)
        v = (self.rng.standard_normal((len(r), self.dim)) * 0.05).astype(np.float32)
        w = (self.rng.standard_normal(len(r)) * 0.01).astype(np.float32)
        self.sink.emit(self.delta(t, r, v, w))
        return len(r)


def _deltas_done(port: int) -> float:
    try:
        return metric_value(port, "offgraph_update_deltas_total")
    except OSError:
        return -1.0


def _consumed(model_dir: Path) -> dict[int, int]:
    """The offsets an updater consumed, per partition (its status file)."""
    from offgraph.modeldir.status_file import read_status

    st = read_status(model_dir) or {}
    return {int(p): d.get("offset", -1) for p, d in (st.get("partitions") or {}).items()}


def drain(
    replicas: dict[str, tuple[int, Path]], last: dict[int, int], timeout: float = 900.0, kill: tuple | None = None
) -> dict:
    """Until every updater consumed the newest offsets ``last`` of each partition: each one's
    rows/s (its deltas counter over the time from its first consumed delta). ``kill`` = (name,
    fraction of ``kill[3]`` deltas, restart()): SIGKILL that one there and restart it (its
    figure then covers both processes' rows and the restart)."""
    t0: dict[str, float] = {}
    t_done: dict[str, float] = {}
    rows: dict[str, float] = {n: 0.0 for n in replicas}
    seen: dict[str, float] = {n: max(0.0, _deltas_done(port)) for n, (port, _) in replicas.items()}  # before
    killed = False
    t_end = time.monotonic() + timeout
    while len(t_done) < len(replicas) and time.monotonic() < t_end:
        now = time.monotonic()
        for n, (port, model_dir) in replicas.items():
            if n in t_done:
                continue
            d = _deltas_done(port)
            if d >= 0:
                new = d - seen[n] if d >= seen[n] else d  # a restarted process counts from 0
                if new > 0 and n not in t0:
                    t0[n] = now
                rows[n] += new
                seen[n] = d
            got = _consumed(model_dir)
            if all(got.get(p, -1) >= off for p, off in last.items()):
                t_done[n] = now
            if kill and not killed and n == kill[0] and rows[n] >= kill[1]:
                kill[2]()
                killed = True
                seen[n] = 0.0
        time.sleep(0.05)
    if len(t_done) < len(replicas):
        raise RuntimeError(f"replicas {sorted(set(replicas) - set(t_done))} did not catch up in {timeout:g}s")
    return {
        n: {
            "rows": rows[n],
            "seconds": t_done[n] - t0.get(n, t_done[n]),
            "rows_per_s": rows[n] / max(t_done[n] - t0.get(n, t_done[n]), 1e-3),
        }
        for n in replicas
    }


def compare(vdirs: list[Path], prod: Producer) -> dict:
    """Every row of every table, raw, in both stores; and against the expected state."""
    from offgraph.store import open_store

    stores = [open_store(v / "store", mode="r") for v in vdirs]
    try:
        t = np.repeat(np.arange(len(prod.table_rows), dtype=np.uint32), prod.table_rows)
        r = np.concatenate([np.arange(n, dtype=np.int64) for n in prod.table_rows])
        got = [(s.read(t, r), s.row_seqs(t, r)) for s in stores]
        (va, wa), sa = got[0]
        identical = all(
            np.array_equal(va, v) and np.array_equal(wa, w) and np.array_equal(sa, s) for (v, w), s in got[1:]
        )
        touched = prod.final_seq >= 0
        codec = stores[0].codec
        want_v, want_w = codec.decode(codec.encode(prod.final_v[touched], prod.final_w[touched]))
        as_expected = (
            np.array_equal(sa[touched], prod.final_seq[touched])
            and np.array_equal(va[touched], want_v)
            and np.array_equal(wa[touched], want_w)
            and (sa[~touched] == -1).all()
        )
        return {
            "rows_compared": int(len(r)),
            "rows_touched": int(touched.sum()),
            "replicas_identical": bool(identical),
            "equal_to_expected_state": bool(as_expected),
        }
    finally:
        for s in stores:
            s.close()


def plot(report: dict, path: Path) -> None:
    """Throughput per phase and replica; delta-to-score latency of the live probes on each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 3.6))
    names = ["one replica", "two: a", "two: b (killed)"]
    vals = [
        report["one_replica"]["rows_per_s"],
        report["two_replicas"]["a"]["rows_per_s"],
        report["two_replicas"]["b"]["rows_per_s"],
    ]
    ax[0].bar(names, [v / 1000 for v in vals], color=["C0", "C1", "C1"])
    ax[0].axhline(200, color="r", ls="--", label="200k/s")
    ax[0].set(title="Kafka -> store, draining a backlog", ylabel="k rows/s")
    ax[0].legend()
    lv = report["live"]
    for n in ("a", "b"):
        ax[1].hist(np.asarray(lv["probes_ms"][n]), bins=40, alpha=0.6, label=f"replica {n}")
    ax[1].axvline(lv["both"]["p99_ms"], color="r", ls="--", label="p99 (both)")
    ax[1].set(title=f"produced -> score changed, {lv['achieved_rate']:,.0f} deltas/s live", xlabel="ms")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-src", required=True, help="an exported MovieLens version (MODELS/movielens/1)")
    ap.add_argument("--data", required=True, help="the MovieLens parquet (requests are drawn from it)")
    ap.add_argument("--deltas", type=int, default=1_000_000, help="deltas per drain phase")
    ap.add_argument("--rate", type=float, default=60_000, help="deltas/s of the live stream (phase 3)")
    ap.add_argument("--live-seconds", type=float, default=60)
    ap.add_argument("--probe-every", type=float, default=0.02, help="pause between one probe's end and the next")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--batch-rows", type=int, default=20_000, help="deltas per produced batch")
    ap.add_argument("--work", help="scratch folder (default: a temporary one, removed)")
    ap.add_argument("--out", default="kafka_replicas.json")
    args = ap.parse_args(argv)

    from offgraph.testing.tansu import tansu_broker

    src = Path(args.model_src)
    bm = open_bench_model(src, Path(args.data), 50, 200, 20)
    dim, table_rows = bm.dim, bm.table_rows
    work = Path(args.work or tempfile.mkdtemp(prefix="og-kafka-"))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    py = [sys.executable, "-m", "offgraph.cli"]
    f_req, f_cands = bm.probe
    tid, row = bm.probe_row
    report: dict = {
        "model_src": str(src),
        "partitions": args.partitions,
        "deltas_per_phase": args.deltas,
        "rate": args.rate,
        "cpus": os.cpu_count(),
    }
    procs: dict[str, object] = {}
    models = {n: work / n / "models" for n in ("a", "b")}
    vdirs = {n: m / NAME / "1" for n, m in models.items()}
    mports = {n: free_port() for n in models}
    sports = {n: free_port() for n in models}

    def updater(n):
        procs["up_" + n] = start_appending(
            py
            + [
                "update",
                "--models",
                str(models[n]),
                "--model",
                NAME,
                "--source",
                f"kafka://{broker}/{TOPIC}",
                "--metrics-port",
                str(mports[n]),
                "--log-every",
                "2",
            ],
            work / f"update_{n}.log",
            env,
        )
        wait_ready(f"http://127.0.0.1:{mports[n]}", 120, procs["up_" + n], path="/metrics")

    try:
        shutil.rmtree(work / "a", ignore_errors=True)
        shutil.rmtree(work / "b", ignore_errors=True)
        for n in models:
            shutil.copytree(src, vdirs[n])
        with tansu_broker(work / "tansu.log") as broker:
            prod = Producer(broker, table_rows, dim, bm.probe_rows, args.partitions)
            prod.sink.version_dir = vdirs["a"]
            # 1. one replica alone drains a backlog
            t0 = time.perf_counter()
            while prod.rows < args.deltas:
                prod.emit_random(min(args.batch_rows, args.deltas - prod.rows))
            prod.sink.flush()
            report["produce_rows_per_s"] = prod.rows / (time.perf_counter() - t0)
            (vdirs["b"] / "stream-start.json").write_bytes((vdirs["a"] / "stream-start.json").read_bytes())
            updater("a")
            report["one_replica"] = drain({"a": (mports["a"], models["a"] / NAME)}, prod.sink.last_offsets)["a"]
            print(
                f"produced {prod.rows:,} deltas at {report['produce_rows_per_s']:,.0f}/s; one replica alone "
                f"applied {report['one_replica']['rows_per_s']:,.0f}/s",
                flush=True,
            )
            # 2. a second replica from the version directory, both draining a backlog at once (a
            # stopped meanwhile); b SIGKILLed halfway
            stop_process(procs.pop("up_a"))
            while prod.rows < 2 * args.deltas:
                prod.emit_random(min(args.batch_rows, 2 * args.deltas - prod.rows))
            prod.sink.flush()
            updater("a")
            updater("b")

            def kill_and_restart():
                procs["up_b"].send_signal(signal.SIGKILL)
                procs["up_b"].wait()
                report["killed_b_at_deltas"] = _deltas_done(mports["a"])
                updater("b")

            reps = {n: (mports[n], models[n] / NAME) for n in models}
            both = drain(reps, prod.sink.last_offsets, kill=("b", args.deltas, kill_and_restart))
            report["two_replicas"] = both
            print(
                f"two replicas draining at once: a {both['a']['rows_per_s']:,.0f}/s, b "
                f"{both['b']['rows_per_s']:,.0f}/s (b SIGKILLed after {args.deltas:,} of its "
                f"{2 * args.deltas:,} deltas and restarted)",
                flush=True,
            )
            # 3. both serve; a live stream; probes on both
            for n in models:
                procs["serve_" + n] = start_appending(
                    py
                    + [
                        "serve",
                        "--models",
                        str(models[n]),
                        "--port",
                        str(sports[n]),
                        "--cache-mb",
                        "64",
                        "--log-level",
                        "warning",
                    ],
                    work / f"serve_{n}.log",
                    env,
                )
            for n in models:
                wait_ready(f"http://127.0.0.1:{sports[n]}", 240, procs["serve_" + n])
            scorers = {n: HttpScorer(sports[n]) for n in models}
            stop = threading.Event()
            live_rows = [0]

            def stream():
                t_start = time.perf_counter()
                while not stop.is_set():
                    due = (time.perf_counter() - t_start) * args.rate - live_rows[0]
                    if due < args.batch_rows / 4:
                        time.sleep(0.01)
                        continue
                    live_rows[0] += prod.emit_random(int(due))
                prod.sink.flush()

            th = threading.Thread(target=stream, daemon=True)
            lat: dict[str, list[float]] = {n: [] for n in models}
            timeouts = 0
            prev = {n: s.score(f_req, f_cands) for n, s in scorers.items()}
            probe_rng = np.random.default_rng(5)
            from offgraph.streaming.kafka.sink import KafkaSink

            probe_sink = KafkaSink(f"kafka://{broker}/{TOPIC}", partitions=args.partitions)
            th.start()
            t_live = time.perf_counter()
            while time.perf_counter() - t_live < args.live_seconds:
                v = (probe_rng.standard_normal((1, dim)) * 0.3).astype(np.float32)
                w = (probe_rng.standard_normal(1) * 0.1).astype(np.float32)
                t0 = time.perf_counter()
                probe_sink.emit(prod.delta(np.array([tid], np.uint32), np.array([row], np.int64), v, w))
                probe_sink.flush(5)
                todo = set(models)
                while todo and time.perf_counter() - t0 < 10:
                    for n in list(todo):
                        s = scorers[n].score(f_req, f_cands)
                        if s != prev[n]:
                            lat[n].append(time.perf_counter() - t0)
                            prev[n] = s
                            todo.discard(n)
                    time.sleep(0.002)
                timeouts += len(todo)
                for n in todo:
                    prev[n] = scorers[n].score(f_req, f_cands)
                time.sleep(args.probe_every)
            stop.set()
            th.join()
            probe_sink.flush()
            report["live"] = {
                "offered_rate": args.rate,
                "rows": live_rows[0],
                "achieved_rate": live_rows[0] / (time.perf_counter() - t_live),
                "probes": {n: percentiles_ms(v) for n, v in lat.items()},
                "timeouts_10s": timeouts,
                "probes_ms": {n: [round(x * 1e3, 2) for x in v] for n, v in lat.items()},
                "both": percentiles_ms([max(a, b) for a, b in zip(lat["a"], lat["b"])]),
            }
            lv = report["live"]
            print(
                f"live stream {lv['achieved_rate']:,.0f} deltas/s into both; produced -> score changed: "
                + "; ".join(
                    f"{n} p50 {lv['probes'][n]['p50_ms']:.0f} / p99 {lv['probes'][n]['p99_ms']:.0f} ms "
                    f"over {lv['probes'][n]['n']}"
                    for n in models
                )
                + f"; both p99 {lv['both']['p99_ms']:.0f} ms; {timeouts} timeouts",
                flush=True,
            )
            # 4. both catch up; compare
            last = dict(prod.sink.last_offsets)
            for p, off in probe_sink.last_offsets.items():
                last[p] = max(last.get(p, -1), off)
            report["final_drain"] = drain(reps, last)
            for n in models:
                stop_process(procs.pop("up_" + n))
            report["convergence"] = compare([vdirs["a"], vdirs["b"]], prod)
            print("convergence:", report["convergence"], flush=True)
            report["acceptance"] = {
                "one_replica_ge_200k_rows_s": (report["one_replica"]["rows_per_s"] or 0) >= 200_000,
                "replicas_identical_and_as_expected": report["convergence"]["replicas_identical"]
                and report["convergence"]["equal_to_expected_state"],
                "deltas_ge_1m": prod.rows >= 1_000_000,
                "freshness_both_p99_le_1s": lv["both"]["p99_ms"] <= 1000.0,
                "probes_ge_200": lv["both"]["n"] >= 200,
                "live_rate_ge_50k": lv["achieved_rate"] >= 50_000,
            }
            print("acceptance:", report["acceptance"], flush=True)
    finally:
        for p in procs.values():
            stop_process(p)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    Path(args.out).write_text(json.dumps(report, indent=2, default=float))
    try:
        plot(report, Path(args.out).with_suffix(".png"))
    except Exception as e:  # noqa: BLE001 - the PNG is a convenience
        print(f"no plot: {e}")
    print(f"wrote {args.out} and its PNG")
    return 0


if __name__ == "__main__":
    sys.exit(main())
