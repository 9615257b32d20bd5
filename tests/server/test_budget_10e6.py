"""The memory budget at 10^6 rows (CI size): a real `offgraph serve` of an `offgraph synth` version, with a memory
budget far smaller than the table, (1) reads its store files with O_DIRECT (past the page cache), (2) holds no
more in its caches than the budget's parts after uniform traffic that overfills every one of them (as
/metrics and GET /v1/models/{name} account them), and (3) scores exactly as the library scorer does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from server_helpers import score, serve_process, stop_server

from bench.lib.traffic import bodies as to_bodies
from bench.lib.traffic import build_requests
from offgraph.testing.harness import wait_ready

REPO = Path(__file__).resolve().parents[2]
ROWS = 10**6
MEMORY_MB = 8  # of a ~27 MB store: the row cache gets ~5 MiB, the block cache 2, the FG item cache ~1300 items
PARTS = {"row_cache", "block_cache", "item_cache", "feed"}
REQUESTS = (200, 500, "uniform", 5)  # requests, candidates, popularity, seed: ~3x10^5 distinct rows, over every part
O_DIRECT = 0o40000  # x86-64 (asm-generic): the flag as /proc/PID/fdinfo shows it, in octal


def _synth(out: Path) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "synth",
            "--out",
            str(out),
            "--rows",
            str(ROWS),
            "--shards",
            "4",
            "--no-progress",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]


def _sst_flags(pid: int, under: Path) -> dict[str, int]:
    """The open flags of each of ``pid``'s descriptors on an .sst file under ``under``."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.endswith(".sst") and target.startswith(str(under)):
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    out[f"{fd} {target}"] = int(re.search(r"^flags:\s+([0-7]+)$", f.read(), re.M).group(1), 8)
        except FileNotFoundError:  # closed meanwhile
            continue
    return out


def _memory_metrics(text: str) -> dict[str, dict[str, float]]:
    """{"budget"|"used": {part: bytes}} of model "scale" from the exposition text."""
    got: dict[str, dict[str, float]] = {"budget": {}, "used": {}}
    for fam in text_string_to_metric_families(text):
        kind = {"offgraph_memory_budget_bytes": "budget", "offgraph_memory_used_bytes": "used"}.get(fam.name)
        for s in fam.samples if kind else ():
            if s.labels.get("model") == "scale":
                got[kind][s.labels["part"]] = s.value
    return got


def test_a_small_budget_holds_under_traffic_with_direct_reads_and_library_scores(tmp_path):
    models = tmp_path / "models"
    _synth(models / "scale" / "1")
    reqs = build_requests(ROWS, *REQUESTS)
    bodies = to_bodies(reqs)
    log = tmp_path / "serve.log"
    proc, url = serve_process(
        models, log, "--memory-mb", str(MEMORY_MB), "--poll-seconds", "0.2", "--prefetch-store", "off"
    )
    try:
        wait_ready(url, 120, proc, log=str(log))
        served = []
        with httpx.Client(base_url=url, timeout=60) as client:
            for body in bodies:
                r = score(client, body, name="scale")
                assert r.status_code == 200, r.text
                served.append(np.asarray(r.json()["scores"], dtype=np.float32))
            metrics = _memory_metrics(client.get("/metrics").text)
            status = client.get("/v1/models/scale").json()["loaded"]
        flags = _sst_flags(proc.pid, models)
    finally:
        stop_server(proc)
    # (1) every table file the server holds open is read past the page cache
    assert flags, "the server holds no .sst file open"
    assert all(f & O_DIRECT for f in flags.values()), {k: oct(v) for k, v in flags.items()}
    # (2) each part holds at most its budget, and the parts' budgets sum to at most --memory-mb ...
    assert set(metrics["budget"]) == PARTS and set(metrics["used"]) == PARTS, metrics
    for part in PARTS:
        assert metrics["used"][part] <= metrics["budget"][part], (part, metrics)
    assert sum(metrics["budget"].values()) <= MEMORY_MB * 2**20
    # ... after traffic that filled them: the row cache full, the block and item caches at their budget
    mem, store = status["memory"], status["store"]
    assert mem["split"]["memory_mb"] == MEMORY_MB and mem["budget_bytes"] == {
        k: int(v) for k, v in metrics["budget"].items()
    }
    # (a set-associative cache is full with a few ways of some sets still empty)
    assert store["cache_entries"] >= 0.8 * store["cache_capacity_rows"] > 0, store
    assert store["cache_misses"] > 1.2 * store["cache_capacity_rows"], store  # it had to evict
    for part in ("block_cache", "item_cache"):
        assert metrics["used"][part] >= 0.5 * metrics["budget"][part], (part, metrics)
    assert re.search(
        rf"scale/1: memory budget {MEMORY_MB} MiB over 1 model\(s\): row cache [\d.]+ MiB, block cache "
        r"\d+ MiB",
        log.read_text(),
    )
    # (3) the scores are the library scorer's, exactly: run as the server runs it, with TensorFlow's pools at
    # one thread (threads split a matmul's sums differently: a last-bit difference), in a fresh process
    lib = tmp_path / "library.npy"
    r = subprocess.run(
        [sys.executable, "-c", LIBRARY_SCORES, str(models / "scale" / "1"), str(lib)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    np.testing.assert_array_equal(np.stack(served), np.load(lib))


LIBRARY_SCORES = f"""
import sys
import numpy as np
from offgraph.server.process.compute_threads import configure_tf_threads
configure_tf_threads(1, 1)
from bench.lib.traffic import build_requests
from offgraph.scoring.scorer import Scorer
with Scorer(sys.argv[1]) as lib:
    np.save(sys.argv[2], np.stack([lib.score(r, c) for r, c in build_requests({ROWS}, *{REQUESTS!r})]))
"""
