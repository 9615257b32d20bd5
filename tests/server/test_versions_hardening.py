"""Versions under stress: corrupt stores, store errors while serving, durable admin pins, slow copies.

Real servers on 127.0.0.1 (in-process uvicorn, or ``offgraph serve`` subprocesses killed with SIGKILL),
real stores exported from a real model (conftest's ``tiny_model``), a real HTTP client.
"""

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from server_helpers import (
    TOKEN,
    ThreadServer,
    copy_models,
    copy_version,
    free_port,
    score,
    serve_process,
    server_config,
    wait_for,
    wait_ready,
)

ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def _sst(version_dir: Path, shard: int) -> Path:
    """The (bulk-loaded, only) SST file of a shard of an exported version."""
    (sst,) = sorted((version_dir / "store" / f"shard-{shard:03d}").glob("*.sst"))
    return sst


def _overwrite(path: Path, offset: int, n: int, seed: int = 0) -> None:
    """Overwrite ``n`` bytes at ``offset`` with random bytes, in place (same inode, same size)."""
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.random.default_rng(seed).bytes(n))


def _status(c) -> dict:
    return c.get("/v1/models/ml").json()


def _loaded(c) -> int | None:
    loaded = _status(c)["loaded"]
    return loaded["version"] if loaded else None


# -- item 2: a corrupt store is never swapped in; a store error while serving is a 503 + fallback -------
def test_corrupt_store_is_refused_at_load(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    v1 = models / "ml" / "1"
    size = _sst(v1, 0).stat().st_size
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            req, cands = requests_[0]
            before = score(c, {"request": req, "candidates": cands}).json()
            assert before["version"] == 1
            # 16 KB of random bytes in the middle of an SST (data blocks), in a version whose manifest lacks
            # the store file records (an older export): only reading the rows can tell
            copy_version(
                v1,
                models / "ml" / "2",
                tamper=lambda d: _overwrite(_sst(d, 0), size // 2 - 8192, 16384),
                manifest_edit=lambda m: m["checksums"].pop("store_files", None),
            )
            # the same over the SST's tail (index, footer): RocksDB's secondary silently drops such a file
            copy_version(v1, models / "ml" / "3", tamper=lambda d: _overwrite(_sst(d, 1), size - 16384, 16384, 1))
            st = wait_for(
                lambda: (lambda s: s if {r["version"] for r in s["refused"]} == {2, 3} else None)(_status(c)),
                60,
                "versions 2 and 3 refused",
            )
            reasons = {r["version"]: r["reason"] for r in st["refused"]}
            assert "shard 0" in reasons[2] and "Corruption" in reasons[2], reasons
            assert "shard-001" in reasons[3] and "differs from the file exported" in reasons[3], reasons
            assert st["loaded"]["version"] == 1 and st["state"] == "serving"
            at = {r["version"]: r["at_unix"] for r in st["refused"]}
            time.sleep(1.5)  # polls every 0.2 s: a refused version whose files did not change is not tried again
            assert {r["version"]: r["at_unix"] for r in _status(c)["refused"]} == at
            after = score(c, {"request": req, "candidates": cands})
            assert after.status_code == 200 and after.json() == before
            assert 'offgraph_model_load_failures_total{model="ml"} 2.0' in c.get("/metrics").text
    finally:
        srv.stop()


def test_store_error_while_serving_is_503_and_falls_back(tiny_model, requests_, tmp_path, caplog):
    models = copy_models(tiny_model[0], tmp_path / "models")
    srv = ThreadServer(server_config(models))
    caplog.set_level(logging.ERROR, logger="offgraph.server")
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            copy_version(models / "ml" / "1", models / "ml" / "2")
            wait_for(lambda: _loaded(c) == 2, 60, "version 2 served")
            # loaded and verified: now its data blocks go bad (all but the last 64 KiB of each SST, where the
            # index and footer are), as a disk could do
            v2 = models / "ml" / "2"
            for shard in (0, 1):
                sst = _sst(v2, shard)
                _overwrite(sst, 0, sst.stat().st_size - 65536, shard)
            req, cands = requests_[1]
            r = score(c, {"request": req, "candidates": cands})
            assert r.status_code == 503, r.text
            assert "Retry-After" in r.headers and "version 2" in r.json()["detail"]
            assert "/" not in r.json()["detail"] and ".sst" not in r.text and str(tmp_path) not in r.text
            logged = "\n".join(rec.getMessage() for rec in caplog.records)
            assert "Corruption" in logged and ".sst" in logged  # the detail goes to the log
            assert 'offgraph_store_errors_total{model="ml"} 1.0' in c.get("/metrics").text
            st = wait_for(
                lambda: (lambda s: s if s["loaded"] and s["loaded"]["version"] == 1 else None)(_status(c)),
                60,
                "the fallback to version 1",
            )
            assert any(x["version"] == 2 and x["reason"].startswith("unhealthy") for x in st["refused"]), st
            assert "unhealthy" in st["last_error"] and str(tmp_path) not in json.dumps(st["refused"])
            r = score(c, {"request": req, "candidates": cands})
            assert r.status_code == 200 and r.json()["version"] == 1
            time.sleep(1.0)  # five polls: version 2 is not loaded again while its files are unchanged
            assert _loaded(c) == 1
    finally:
        srv.stop()


def test_store_error_without_another_version_keeps_serving(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            sst = _sst(models / "ml" / "1", 0)
            _overwrite(sst, 0, sst.stat().st_size - 65536)
            req, cands = requests_[2]
            assert score(c, {"request": req, "candidates": cands}).status_code == 503
            st = wait_for(lambda: (lambda s: s if s["last_error"] else None)(_status(c)), 30, "the failed fallback")
            assert "no other version loads" in st["last_error"] and st["loaded"]["version"] == 1, st
            r = score(c, {"request": req, "candidates": cands})  # still answered, still a 503, no crash
            assert r.status_code == 503 and r.headers["Retry-After"]
            assert 'offgraph_store_errors_total{model="ml"} 2.0' in c.get("/metrics").text
            assert c.get("/healthz").status_code == 200
    finally:
        srv.stop()


# -- item 5: a version copied slowly is retried; temporary names are never versions ------------------------
def test_slow_copy_is_retried_and_temp_names_are_ignored(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    v1 = models / "ml" / "1"
    for temp in (".tmp-3", "3.tmp", "4~"):  # complete copies under names a publisher may use mid-copy
        shutil.copytree(v1, models / "ml" / temp)
    (models / "ml" / "admin-policy.json").write_text('{"policy": "pinned", "version": "x"')  # torn or edited
    srv = ThreadServer(server_config(models))
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            st = _status(c)
            assert st["policy"] == "latest" and st["loaded"]["version"] == 1, st  # a bad record is ignored
            v2 = models / "ml" / "2"
            v2.mkdir()
            shutil.copy2(v1 / "manifest.json", v2 / "manifest.json")  # the manifest first ...
            st = wait_for(lambda: (lambda s: s if s["refused"] else None)(_status(c)), 30, "version 2 refused")
            assert "missing dense/" in st["refused"][0]["reason"]
            time.sleep(4)  # ... the rest 4 s later
            shutil.copytree(v1 / "store", v2 / "store")
            shutil.copytree(v1 / "dense", v2 / "dense")
            wait_for(lambda: _loaded(c) == 2, 60, "version 2 loaded once its files arrived")
            st = _status(c)
            assert st["versions_on_disk"] == [1, 2] and st["refused"] == []
            req, cands = requests_[0]
            assert score(c, {"request": req, "candidates": cands}).json()["version"] == 2
    finally:
        srv.stop()


# -- item 4: admin pins and unloads survive a kill -9; 503 + Retry-After while loading ----------------------
def _serve(models: Path, port: int, log: Path, *extra: str) -> subprocess.Popen:
    """``offgraph serve`` on ``port`` in its own process group (so that SIGKILL reaches every worker)."""
    flags = ["--admin-token", TOKEN, "--poll-seconds", "0.2", "--cache-mb", "8"]
    flags += ["--intra-threads", "1", "--inter-threads", "1", *extra]
    return serve_process(models, log, *flags, port=port, new_session=True, append=True)[0]


def _kill9(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def _versions_seen(url: str, body: dict, n: int) -> set:
    """Versions answering ``n`` score calls, each on a new connection (spread over the workers)."""
    out = set()
    for _ in range(n):
        with httpx.Client(base_url=url, timeout=30) as c:
            r = score(c, body)
            out.add((r.status_code, r.json().get("version")))
    return out


def _two_versions(tiny_model, requests_, tmp_path):
    """MODELS with versions 1 and 2 of the tiny model, a free port, a log path, the URL and a score body."""
    models = copy_models(tiny_model[0], tmp_path / "models")
    copy_version(models / "ml" / "1", models / "ml" / "2")
    port = free_port()
    req, cands = requests_[0]
    return models, port, tmp_path / "serve.log", f"http://127.0.0.1:{port}", {"request": req, "candidates": cands}


def test_admin_pin_and_unload_survive_kill9(tiny_model, requests_, tmp_path):
    models, port, log, url, body = _two_versions(tiny_model, requests_, tmp_path)
    proc = _serve(models, port, log)
    try:
        wait_ready(url, 120, proc)
        with httpx.Client(base_url=url, timeout=60) as c:
            assert _loaded(c) == 2
            r = c.post("/v1/models/ml:load", json={"version": 1}, headers=ADMIN)
            assert r.status_code == 200 and r.json()["policy"] == "pinned", r.text
        _kill9(proc)
        proc = _serve(models, port, log)
        wait_ready(url, 120, proc)
        with httpx.Client(base_url=url, timeout=60) as c:
            st = _status(c)
            assert st["policy"] == "pinned" and st["loaded"]["version"] == 1, st
            assert score(c, body).json()["version"] == 1
            assert c.post("/v1/models/ml:unload", headers=ADMIN).status_code == 200
        _kill9(proc)
        proc = _serve(models, port, log)
        wait_ready(url, 120, proc)  # an unloaded model is ready
        with httpx.Client(base_url=url, timeout=60) as c:
            st = _status(c)
            assert st["policy"] == "unloaded" and st["loaded"] is None, st
            assert score(c, body).status_code == 404
            r = c.post("/v1/models/ml:load", json={}, headers=ADMIN)  # follow the newest again
            assert r.status_code == 200 and r.json()["loaded"]["version"] == 2, r.text
        assert json.loads((models / "ml" / "admin-policy.json").read_text())["policy"] == "latest"
    finally:
        _kill9(proc)


def test_admin_pin_survives_a_restart_of_two_workers(tiny_model, requests_, tmp_path):
    models, port, log, url, body = _two_versions(tiny_model, requests_, tmp_path)
    proc = _serve(models, port, log, "--workers", "2")
    try:
        wait_ready(url, 180, proc)
        wait_for(lambda: _versions_seen(url, body, 6) == {(200, 2)}, 120, "both workers serving version 2")
        with httpx.Client(base_url=url, timeout=300) as c:
            r = c.post("/v1/models/ml:load", json={"version": 1}, headers=ADMIN)
            assert r.status_code == 200, r.text
        assert _versions_seen(url, body, 8) == {(200, 1)}
        _kill9(proc)  # the supervisor and both workers
        proc = _serve(models, port, log, "--workers", "2")
        wait_ready(url, 180, proc)
        # both workers start with the pin: neither ever serves version 2 after the restart (a worker
        # still on its first load answers 503 meanwhile)
        seen: set = set()

        def all_on_v1() -> bool:  # 16 new connections: both workers answer (2**-15 that one takes them all)
            now = _versions_seen(url, body, 16)
            seen.update(now)
            return now == {(200, 1)}

        wait_for(all_on_v1, 120, "both workers serving version 1")
        assert seen <= {(200, 1), (503, None)}, seen
        assert _versions_seen(url, body, 12) == {(200, 1)}
    finally:
        _kill9(proc)


def test_score_is_503_with_retry_after_while_loading(tiny_model, requests_, tmp_path):
    models = copy_models(tiny_model[0], tmp_path / "models")
    v1 = models / "ml" / "1"
    # a dense/ file that blocks its reader until the test writes it: the first load waits on it
    os.mkfifo(v1 / "dense" / "slow-disk")
    manifest = json.loads((v1 / "manifest.json").read_text())
    manifest["checksums"]["dense"]["slow-disk"] = hashlib.sha256(b"x").hexdigest()
    (v1 / "manifest.json").write_text(json.dumps(manifest))
    port, log = free_port(), tmp_path / "serve.log"
    url = f"http://127.0.0.1:{port}"
    req, cands = requests_[0]
    proc = _serve(models, port, log)
    released = threading.Event()

    def release():
        if not released.is_set():
            released.set()
            with open(v1 / "dense" / "slow-disk", "wb") as f:  # opens once the loader has it open to read
                f.write(b"x")

    try:
        wait_for(lambda: _healthy(url, proc), 120, "the server answering")
        with httpx.Client(base_url=url, timeout=30) as c:
            r = score(c, {"request": req, "candidates": cands})
            assert r.status_code == 503 and "loading" in r.json()["detail"], r.text
            assert int(r.headers["Retry-After"]) >= 1
            assert _status(c)["state"] in ("new", "loading")
            threading.Thread(target=release, daemon=True).start()
            wait_ready(url, 120, proc)
            r = score(c, {"request": req, "candidates": cands})
            assert r.status_code == 200 and r.json()["version"] == 1
    finally:
        if not released.is_set():
            threading.Thread(target=release, daemon=True).start()
        _kill9(proc)


def _healthy(url: str, proc: subprocess.Popen) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"server exited with {proc.returncode}")
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False
