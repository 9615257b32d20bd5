"""Versions in object storage, against a real S3 server (SeaweedFS on loopback, started and stopped here):
`offgraph export --out s3://...` and `offgraph synth --out s3://...` publish, `offgraph serve --models
s3://...` copies each new complete version down into its cache, verified, and only then serves it
(issue 50 item 4)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_helpers import ScoreHammer, score, serve_process, stop_server, wait_for, wait_ready

from offgraph.testing.seaweedfs import seaweedfs

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BUCKET = "models"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        server.create_bucket(BUCKET)
        yield server


def cli(s3, tmp: Path, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, **s3.env, "OFFGRAPH_UPLOAD_DIR": str(tmp / "uploads"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("AWS_ALLOW_HTTP")  # offgraph allows a plain-http endpoint by itself; only the AWS variables
    return subprocess.run(
        [sys.executable, "-m", "offgraph.cli", *argv], env=env, capture_output=True, text=True, timeout=timeout
    )


def model_status(url: str, name: str) -> dict:
    r = httpx.get(f"{url}/v1/models/{name}", timeout=10)
    return r.json() if r.status_code == 200 else {}


def serving_version(url: str, name: str) -> int | None:
    return (model_status(url, name).get("loaded") or {}).get("version")


@pytest.fixture(scope="module")
def s3_server(s3, tiny_model, tmp_path_factory):
    """`offgraph export --out s3://models/t1/ml/1` of the run behind conftest's tiny_model, and a server on
    s3://models/t1: (url, log, cache dir, tmp)."""
    models, _ = tiny_model
    tmp = tmp_path_factory.mktemp("s3_serve")
    r = cli(
        s3,
        tmp,
        "export",
        "--run",
        str(models.parent / "run"),
        "--out",
        f"s3://{BUCKET}/t1/ml/1",
        "--shards",
        "2",
        "--quant",
        "fp32",
        "--no-progress",
    )
    assert r.returncode == 0, r.stderr
    assert "uploaded" in r.stdout
    assert not (Path.cwd() / "s3:").exists()
    cache = tmp / "cache"
    env = {**s3.env, "AWS_ALLOW_HTTP": None}
    proc, url = serve_process(
        f"s3://{BUCKET}/t1", tmp / "serve.log", "--model-cache-dir", str(cache), "--poll-seconds", "0.2", env=env
    )
    try:
        wait_ready(url, 120, proc, log=str(tmp / "serve.log"))
        yield url, tmp / "serve.log", cache, tmp
    finally:
        stop_server(proc)


def test_a_version_exported_to_s3_serves_the_scores_of_the_same_version_on_disk(
    s3_server, tiny_model, requests_, tmp_path
):
    url, _, cache, _ = s3_server
    models, _ = tiny_model
    assert (cache / "ml" / "1" / "manifest.json").is_file()
    assert serving_version(url, "ml") == 1
    proc, disk_url = serve_process(models, tmp_path / "disk.log")
    try:
        wait_ready(disk_url, 120, proc)
        with httpx.Client(base_url=url, timeout=30) as c3, httpx.Client(base_url=disk_url, timeout=30) as cd:
            for req, cands in requests_[:20]:
                a = score(c3, {"request": req, "candidates": cands})
                b = score(cd, {"request": req, "candidates": cands})
                assert a.status_code == b.status_code == 200
                assert a.json()["scores"] == b.json()["scores"]
                assert len(a.json()["scores"]) == len(cands)
    finally:
        stop_server(proc)


def test_a_corrupt_sst_in_the_bucket_is_refused_naming_it_and_the_serving_version_keeps_serving(
    s3, s3_server, tiny_model, requests_
):
    """Version 2 is version 1's files with one byte of one SST flipped in the bucket (the size unchanged):
    refused naming the file while a client scores throughout with no failure; once the object is put
    right, the next try copies it and version 2 serves."""
    url, log, cache, _ = s3_server
    models, _ = tiny_model
    src = models / "ml" / "1"
    c = s3.client()
    sst = next(p for p in sorted((src / "store").rglob("*.sst")) if p.stat().st_size > 100)
    rel = str(sst.relative_to(src))
    hammer = ScoreHammer(url, requests_).start()
    try:
        for p in sorted(src.rglob("*")):  # the manifest last, as offgraph uploads
            if p.is_file() and p.name != "manifest.json":
                body = bytearray(p.read_bytes())
                if p == sst:
                    body[len(body) // 2] ^= 0x01
                c.put_object(Bucket=BUCKET, Key=f"t1/ml/2/{p.relative_to(src)}", Body=bytes(body))
        c.put_object(Bucket=BUCKET, Key="t1/ml/2/manifest.json", Body=(src / "manifest.json").read_bytes())
        err = wait_for(lambda: model_status(url, "ml").get("last_error"), 60, "version 2 refused")
        assert "version 2" in err and rel in err and "corrupt" in err, err
        assert rel in log.read_text()
        assert not (cache / "ml" / "2").exists()
        n = len(hammer.seen)
        wait_for(lambda: len(hammer.seen) > n + 20, 30, "more requests after the refusal")
        # put right: retried after its backoff, copied, verified and served
        c.put_object(Bucket=BUCKET, Key=f"t1/ml/2/{rel}", Body=sst.read_bytes())
        wait_for(lambda: serving_version(url, "ml") == 2, 90, "version 2 serving once its SST is put right")
    finally:
        seen = hammer.stop()
    assert len(seen) > 20
    assert [s for s, _ in seen if s != 200] == []  # 0 failed requests throughout
    assert {v for _, v in seen} <= {1, 2}
    assert (cache / "ml" / "2" / "manifest.json").is_file()


def test_an_upload_killed_midway_never_serves_and_a_rerun_resumes_then_serves(s3, tmp_path):
    """`offgraph synth --out s3://...` killed (-9) once some files are up: no manifest in the bucket, a
    server on the prefix keeps serving version 1 through several scans; the same command again uploads
    fewer bytes than the version holds (the finished files stay), then version 2 serves."""
    ok = cli(s3, tmp_path, "synth", "--out", f"s3://{BUCKET}/t2/syn/1", "--rows", "5e4", "--no-progress")
    assert ok.returncode == 0, ok.stderr
    cache = tmp_path / "cache"
    proc, url = serve_process(
        f"s3://{BUCKET}/t2",
        tmp_path / "serve.log",
        "--model-cache-dir",
        str(cache),
        "--poll-seconds",
        "0.2",
        env={**s3.env, "AWS_ALLOW_HTTP": None},
    )
    try:
        wait_ready(url, 120, proc, log=str(tmp_path / "serve.log"))
        assert serving_version(url, "syn") == 1
        argv = ["synth", "--out", f"s3://{BUCKET}/t2/syn/2", "--rows", "3e6", "--no-progress"]
        env = {**os.environ, **s3.env, "OFFGRAPH_UPLOAD_DIR": str(tmp_path / "uploads"), "TF_CPP_MIN_LOG_LEVEL": "2"}
        env.pop("AWS_ALLOW_HTTP")
        up = subprocess.Popen([sys.executable, "-m", "offgraph.cli", *argv], env=env, stdout=subprocess.DEVNULL)
        records = tmp_path / "uploads"

        def uploaded_bytes() -> int:
            for rec in records.glob("*/upload.json"):
                try:
                    return sum(d["bytes"] for d in json.loads(rec.read_text())["done"].values())
                except (OSError, ValueError, KeyError):
                    return 0
            return 0

        wait_for(lambda: uploaded_bytes() >= 20 << 20, 120, "20 MiB of version 2 uploaded", interval=0.005)
        os.kill(up.pid, signal.SIGKILL)
        up.wait(10)
        done_at_kill = uploaded_bytes()
        c = s3.client()
        keys = [o["Key"] for o in c.list_objects_v2(Bucket=BUCKET, Prefix="t2/syn/2/").get("Contents", [])]
        assert keys and "t2/syn/2/manifest.json" not in keys
        scans = model_status(url, "syn")["scans"]
        wait_for(lambda: model_status(url, "syn")["scans"] >= scans + 5, 30, "five more scans")
        assert serving_version(url, "syn") == 1 and not (cache / "syn" / "2").exists()

        t0 = time.monotonic()
        rerun = cli(s3, tmp_path, *argv)
        assert rerun.returncode == 0, rerun.stderr
        manifest = json.loads(c.get_object(Bucket=BUCKET, Key="t2/syn/2/manifest.json")["Body"].read())
        total = sum(f["bytes"] for f in manifest["checksums"]["files"].values())
        uploaded = float(rerun.stdout.split("uploaded ")[1].split("(")[1].split(" MiB")[0]) * 2**20
        assert "already there" in rerun.stdout, rerun.stdout
        # what the first run finished stayed (the summary's MiB has one decimal)
        assert uploaded <= total - done_at_kill + 0.06 * 2**20, (uploaded, total, done_at_kill, rerun.stdout)
        wait_for(lambda: serving_version(url, "syn") == 2, 120, "version 2 serving after the resumed upload")
        assert time.monotonic() - t0 < 200
    finally:
        stop_server(proc)
