"""The RocksDB layout's pod run as local processes: each container's args and environment exactly as the
rendered manifest gives them (ConfigMap and Secret values resolved), with only what a node and its cluster
would provide put in their place: the volumes' mount paths become folders here (the memory-backed feed
emptyDir a folder under /dev/shm, the models volume an empty folder), the ports free loopback ports, the
object storage a real S3 server (SeaweedFS on loopback: the Secret's endpoint and credentials become its
own, the ConfigMap's bucket is created there) and the updater's Kafka source a spool. Both start on an
empty bucket and wait; a version published with `offgraph export --out s3://...` is copied down by the
server, which turns ready on the probes' paths, the updater writes into that copy, a streamed row goes
from the spool through the updater and the shared memory-backed folder to the server, and both stop within
the pod's grace period with exit status 0."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx
import numpy as np
import pytest
from kube_manifests import container, layout_objects, pod_spec
from polling import wait_for
from scorer_parts import DenseHead, pooled

from offgraph.calibration import calibrate
from offgraph.features.hashing import row_of
from offgraph.objectstore import Location
from offgraph.scoring.scorer import Scorer
from offgraph.streaming.deltas import publish_delta
from offgraph.testing.harness import ServerProcess, free_port, stop_process
from offgraph.testing.seaweedfs import seaweedfs

REPO = Path(__file__).resolve().parents[2]
REQUEST = {"user_id": 7, "age": 30, "gender": "F", "occupation": "writer", "zip_prefix": "941"}
CANDS = [
    {"movie_id": 50, "genres": ["Action", "Sci-Fi"], "title_words": ["star", "wars"]},
    {"movie_id": 181, "genres": ["Action"]},
    {"movie_id": 1},
]


def _on_this_machine(c, mounts: dict[str, str], overrides: dict[str, str]) -> tuple[list[str], dict[str, str | None]]:
    """The container's command and environment with each volume's mount path replaced by its local folder
    (``mounts``: volume -> folder) and ``overrides`` set; every other ``OFFGRAPH_*`` and ``AWS_*`` variable
    of this process removed, so that only the manifest's reach the process."""
    paths = {c.mounts()[v]: local for v, local in mounts.items() if v in c.mounts()}

    def local(text: str) -> str:
        for path, here in paths.items():
            if text == path or text.startswith(path + "/"):
                return here + text[len(path) :]
        return text

    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("OFFGRAPH_", "AWS_"))}
    env.update({k: local(v) for k, v in c.env().items()})
    env.update(overrides)
    return [sys.executable, "-m", "offgraph.cli", *map(local, c.args())], env


def _scores(client) -> list[float]:
    r = client.post("/v1/models/ml:score", json={"request": REQUEST, "candidates": CANDS})
    assert r.status_code == 200, r.text
    return r.json()["scores"]


def _updater_metrics(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        lines = resp.read().decode().splitlines()
    return {ln.split("{")[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("offgraph_update_")}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_rocksdb_pod_serves_a_streamed_row_as_local_processes(tiny_model, tmp_path):
    objects = layout_objects("rocksdb")
    server_c, updater_c = container(objects, "server"), container(objects, "updater")
    assert server_c.workload is updater_c.workload
    volumes = {v["name"]: v for v in pod_spec(server_c.workload)["volumes"]}
    feed_volume = next(n for n, v in volumes.items() if v.get("emptyDir", {}).get("medium") == "Memory")
    uri = server_c.env()["OFFGRAPH_MODELS"]
    where = Location.parse(uri)
    # the Secret's keys: what the server reaches the bucket with (each replaced by the S3 server's own)
    secret = {k for k in server_c.env() if k.startswith("AWS_")}
    assert secret == {"AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}, secret

    models = tmp_path / "models"  # the pod's models volume: empty, as a new pod's claim
    models.mkdir()
    feed = Path(tempfile.mkdtemp(prefix="offgraph-k8s-feed-", dir="/dev/shm"))
    spool = tmp_path / "spool"
    port, metrics_port = free_port(), free_port()
    mounts = {"models": str(models), feed_volume: str(feed)}

    vdir = tiny_model[0] / "ml" / "1"  # what `offgraph export` of its run writes (shards 2, fp32)
    with Scorer(vdir) as ref:  # the expected score once the row is applied, from the dense model by hand
        emb, fo, _ = pooled(ref, REQUEST, CANDS)
        spec = ref.spec
    f = spec.field_index("user_id")
    row = row_of(REQUEST["user_id"], spec.model.hash, spec.fields[f].rows)
    v = np.random.default_rng(5).normal(0, 0.2, emb.shape[-1]).astype(np.float32)
    w = np.float32(0.5)
    emb[:, f, :] = v  # user_id is single-valued: its pooled vector is the row itself
    fo[:, f] = w
    expected = calibrate(DenseHead(vdir)(emb, fo), spec.model.calibration)

    server = updater = publish = None
    with seaweedfs(tmp_path / "s3") as s3:
        s3.create_bucket(where.bucket)
        aws = {k: s3.env[k] for k in secret}
        # what the node gives instead: loopback ports (the pod's own network), a spool for the Kafka source
        server_cmd, server_env = _on_this_machine(
            server_c, mounts, {"OFFGRAPH_PORT": str(port), "OFFGRAPH_HOST": "127.0.0.1", **aws}
        )
        updater_cmd, updater_env = _on_this_machine(
            updater_c, mounts, {"OFFGRAPH_SOURCE": f"spool:{spool}", "OFFGRAPH_METRICS_PORT": str(metrics_port)}
        )
        assert server_env["OFFGRAPH_FEED_SHM"] == updater_env["OFFGRAPH_FEED_SHM"] == str(feed)
        cache = Path(server_env["OFFGRAPH_MODEL_CACHE_DIR"])
        assert updater_env["OFFGRAPH_MODELS"] == str(cache) and cache.parent == models
        try:
            server = ServerProcess(server_cmd, port, tmp_path / "server.log", cwd=REPO, env=server_env)
            updater = ServerProcess(
                updater_cmd, metrics_port, tmp_path / "updater.log", cwd=REPO, env=updater_env, name="updater"
            )
            # an empty bucket: the updater waits for a version (it does not exit), the server is not ready
            updater.wait_ready(60, path="/metrics")  # its containerPort "metrics"
            wait_for(
                lambda: _updater_metrics(metrics_port).get("offgraph_update_waiting_for_version") == 1,
                30,
                "the updater waiting for a version",
            )
            # the kubelet's order: the startup probe, then readiness, which waits for a version
            server.wait_ready(120, path=server_c.spec["startupProbe"]["httpGet"]["path"])
            not_yet = httpx.get(server.url + server_c.spec["readinessProbe"]["httpGet"]["path"], timeout=5)
            assert not_yet.status_code == 503, not_yet.text
            publish = subprocess.Popen(  # a version published to the bucket, as a user does
                [sys.executable, "-m", "offgraph.cli", "export", "--run", str(tiny_model[0].parent / "run")]
                + ["--out", f"{uri}/ml/1", "--shards", "2", "--quant", "fp32", "--no-progress"],
                env={**os.environ, **s3.env, "OFFGRAPH_UPLOAD_DIR": str(tmp_path / "uploads")},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            out, _ = publish.communicate(timeout=120)
            assert publish.returncode == 0, out[-3000:]
            server.wait_ready(120, path=server_c.spec["readinessProbe"]["httpGet"]["path"])
            assert (cache / "ml" / "1" / "manifest.json").is_file(), "served from the copy in the models volume"
            assert f"version 1 copied down from {uri}" in (tmp_path / "server.log").read_text()
            live = httpx.get(server.url + server_c.spec["livenessProbe"]["httpGet"]["path"], timeout=5)
            assert live.status_code == 200
            wait_for(
                lambda: _updater_metrics(metrics_port).get("offgraph_update_live_version") == 1,
                30,
                "the updater writing version 1 of the copy",
            )
            assert _updater_metrics(metrics_port)["offgraph_update_waiting_for_version"] == 0

            with httpx.Client(base_url=server.url, timeout=10) as client:
                before = _scores(client)
                assert not np.allclose(before, expected, atol=1e-6)
                publish_delta(
                    spool,
                    model="ml",
                    model_version=1,
                    table_ids=[f],
                    rows=[row],
                    vectors=v[None, :],
                    first_order=[w],
                    seqs=[1],
                    event_time_ms=int(time.time() * 1000),
                )

                def changed():
                    assert updater.proc.poll() is None, (tmp_path / "updater.log").read_text()[-3000:]
                    got = _scores(client)
                    return got if not np.array_equal(got, before) else None

                # sooner than the server's RocksDB catch-up (--catch-up-seconds, 30 s): through the shared feed
                got = wait_for(changed, 20, "the streamed row served", interval=0.05)
                np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
            # the row went through the pod's memory-backed folder: the updater's feed lives there
            assert [p.name for p in feed.iterdir() if p.name.startswith("offgraph-feed-")], list(feed.iterdir())
            # and into the copy the server serves from (the updater's status beside it)
            assert (cache / "ml" / "updater-status.json").is_file()

            # SIGTERM to both, as the kubelet sends it: each exits 0 within the pod's grace period
            grace = pod_spec(server_c.workload)["terminationGracePeriodSeconds"]
            started = time.monotonic()
            for p in (server, updater):
                p.proc.terminate()
            codes = [stop_process(p.proc, timeout=grace) for p in (server, updater)]
            took = time.monotonic() - started
            assert codes == [0, 0] and took < grace, (codes, took, (tmp_path / "server.log").read_text()[-2000:])
        finally:
            if publish is not None and publish.poll() is None:
                publish.kill()
                publish.wait(10)
            for p in (updater, server):
                if p is not None:
                    p.stop()
            shutil.rmtree(feed, ignore_errors=True)
