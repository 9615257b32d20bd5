"""The tables-beyond-RAM bench's path at CI size: a 10^6-row `offgraph synth` model served by a real `offgraph serve`, swapped
under light load (v2 appears, then an admin rollback to v1) with no failed request, and its scores equal
to the library scorer's for the same requests. Memory is the bench's business (bench/scale.py), not a test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
from server_helpers import score, serve_process, stop_server, wait_for

from bench.lib.traffic import bodies as to_bodies
from bench.lib.traffic import build_requests
from offgraph.scoring.scorer import Scorer
from offgraph.testing.harness import wait_ready

REPO = Path(__file__).resolve().parents[2]
ROWS = 10**6
TOKEN = "t12"


def _synth(out: Path, seed: int) -> None:
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
            "--seed",
            str(seed),
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


class Load:
    """Light steady traffic from two threads (keep-alive clients); every answer kept: (status, version)."""

    def __init__(self, url: str, bodies: list[bytes]):
        self.url, self.bodies = url, bodies
        self.answers: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(2)]

    def _run(self, k: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as client:
            j = k
            while not self.stop.is_set():
                try:
                    r = score(client, self.bodies[j % len(self.bodies)], name="scale")
                    self.answers.append((r.status_code, r.json().get("version", -1) if r.status_code == 200 else -1))
                except httpx.HTTPError as e:
                    self.errors.append(repr(e))
                j += 2

    def last_version(self) -> int | None:
        return self.answers[-1][1] if self.answers else None

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)


def _scores(client: httpx.Client, body: bytes) -> tuple[int, np.ndarray]:
    r = score(client, body, name="scale")
    assert r.status_code == 200, r.text
    return r.json()["version"], np.asarray(r.json()["scores"], dtype=np.float32)


def test_synth_model_served_swapped_under_load_and_scored_like_the_library(tmp_path):
    models = tmp_path / "models"
    _synth(models / "scale" / "1", seed=0)
    _synth(tmp_path / "stage" / "2", seed=1)  # published later by a rename, as a copy tool would
    reqs = build_requests(ROWS, 60, 200, "zipf", seed=3)
    bodies = to_bodies(reqs)
    log = tmp_path / "serve.log"
    proc, url = serve_process(models, log, "--admin-token", TOKEN, "--poll-seconds", "0.2", "--cache-mb", "32")
    try:
        wait_ready(url, 120, proc, log=str(log))
        with httpx.Client(base_url=url, timeout=30) as client, Load(url, bodies[2:]) as load:
            wait_for(lambda: len(load.answers) >= 10, 60, "steady traffic on v1")
            v, served_v1 = _scores(client, bodies[0])
            assert v == 1
            os.rename(tmp_path / "stage" / "2", models / "scale" / "2")  # v2 appears
            wait_for(lambda: load.last_version() == 2, 60, "version 2 serving")
            v, served_v2 = _scores(client, bodies[1])
            assert v == 2
            r = client.post("/v1/models/scale:rollback", headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200, r.text
            wait_for(lambda: load.last_version() == 1, 60, "version 1 serving again")
            n = len(load.answers)
            wait_for(lambda: len(load.answers) >= n + 10, 60, "traffic after the rollback")
            # the version rolled back from is freed in paced pieces after it drained: wait for it, under traffic
            wait_for(lambda: "closed version 2 of scale" in log.read_text(), 60, "version 2 closed")
        statuses = [s for s, _ in load.answers]
        versions = [v for _, v in load.answers]
        assert load.errors == [] and set(statuses) == {200}, (load.errors[:3], sorted(set(statuses)))
        # each version took over once, in order: 1 ... 2 ... 1 (the two threads interleave at the edges)
        first2, last2 = versions.index(2), len(versions) - 1 - versions[::-1].index(2)
        assert set(versions[:first2]) == {1} and versions[-1] == 1 and set(versions[last2 + 1 :]) == {1}
    finally:
        stop_server(proc)
    for version, _body, served in ((1, bodies[0], served_v1), (2, bodies[1], served_v2)):
        with Scorer(models / "scale" / str(version)) as lib:
            request, candidates = reqs[0] if version == 1 else reqs[1]
            np.testing.assert_array_equal(served, lib.score(request, candidates))
    assert not np.allclose(served_v1, served_v2)  # two different models were served
    # each newcomer was warmed with the rows and FG items the version it replaced had been serving (same
    # spec), at the default share of the time while the other served
    text = log.read_text()
    for v in (2, 1):
        assert re.search(rf"scale/{v}: warmed with [1-9]\d* hot rows and [1-9]\d* FG items .* \(paced to 25% ", text), (
            text[-3000:]
        )
        # its store is read with direct I/O: the page cache is not in its read path, so "auto" read nothing in
        assert re.search(rf"scale/{v}: store not prefetched: the store is read with direct I/O", text), text[-3000:]
        assert not re.search(rf"scale/{v}: prefetched", text)
        # and the version it replaced was closed, its memory freed in paced pieces (Scorer.release)
        assert re.search(rf"closed version {3 - v} of scale \(memory freed in [\d.]+s, \d+ ms of it work\)", text)
