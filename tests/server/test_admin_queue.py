"""Admin calls while a version load is in flight (issue 48, defect 6): a call that can be refused is refused at
once, the others queue with a bound (``--admin-queue``, ``--admin-wait-seconds``) and are answered 429 with
``Retry-After`` past it, having done nothing; the queued ones complete correctly once the load is done.

Real uvicorn on 127.0.0.1, real httpx clients, real versions exported from a real model (conftest's
``tiny_model``). The load in flight is real: version 2's ``dense/`` holds a FIFO recorded in its manifest's
checksums, so the loader's checksum pass blocks on it until the test writes its one byte (as a slow disk
would), and the version then loads and serves.
"""

import errno
import hashlib
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import Request
from server_helpers import TOKEN, ThreadServer, copy_models, copy_version, server_config, wait_for

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
AT_ONCE_S = 1.0
"""A refusal, or a full queue's 429, must come within this: the load in flight takes as long as the test wants."""
CLIENT_TIMEOUT_S = 8.0
"""Before the fix these calls waited for the load, which only ends when the test releases it: a timeout."""


def _app_with_probe(config):
    """The server's app, plus a test-only route reading the registry's count of admin calls under way or waiting."""
    from offgraph.server import create_app

    app = create_app(config)

    @app.get("/test-only/admin-calls/{name}", include_in_schema=False)
    async def admin_calls(name: str, request: Request) -> dict:
        return {"calls": request.state.server.models.admin_calls(name)}

    return app


@contextmanager
def _server(tiny_model, tmp_path: Path, **config):
    models = copy_models(tiny_model[0], tmp_path / "models")
    cfg = server_config(models, **config)
    srv = ThreadServer(cfg, app=_app_with_probe(cfg))
    srv.models = models
    try:
        yield srv
    finally:
        srv.stop()


def _status(c: httpx.Client) -> dict:
    return c.get("/v1/models/ml").json()


class SlowLoad:
    """Version 2, whose load blocks on a FIFO in its dense/ until ``release``: the poll picks it up as the
    newest version, and the loader thread is then busy with it."""

    def __init__(self, models: Path):
        self.fifo = models / "ml" / "2" / "dense" / "slow-disk"
        self._released = False

        def tamper(d: Path) -> None:
            os.mkfifo(d / "dense" / "slow-disk")

        def record(m: dict) -> None:
            m["checksums"]["dense"]["slow-disk"] = hashlib.sha256(b"x").hexdigest()

        copy_version(models / "ml" / "1", models / "ml" / "2", tamper=tamper, manifest_edit=record)

    def release(self) -> None:
        """Let the load go on (idempotent): write the FIFO's byte once its reader (the loader) has it open."""
        if self._released:
            return
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:  # ENXIO: no reader (yet, or any more)
            if e.errno != errno.ENXIO:
                raise
            wait_for(lambda: self._open_writer(), 30, "the loader reading the FIFO")
            fd = self._fd
        else:
            self._fd = fd
        self._released = True
        os.set_blocking(fd, True)
        os.write(fd, b"x")
        os.close(fd)

    def _open_writer(self) -> bool:
        try:
            self._fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)
            return True
        except OSError:
            return False


@contextmanager
def _load_in_flight(srv, c: httpx.Client):
    """Version 2 loading (and blocked) in the loader thread while the block runs; released on exit."""
    slow = SlowLoad(srv.models)
    try:
        wait_for(lambda: _status(c)["loading_version"] == 2, 30, "the poll loading version 2")
        yield slow
    finally:
        slow.release()


def _timed(c: httpx.Client, method: str, url: str, **kw) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    try:
        headers = {**ADMIN, **kw.pop("headers", {})}
        r = c.request(method, url, headers=headers, timeout=CLIENT_TIMEOUT_S, **kw)
    except httpx.TimeoutException:
        pytest.fail(f"{method} {url} got no answer in {CLIENT_TIMEOUT_S}s: it waited for the load in flight")
    return r, time.perf_counter() - t0


def _in_background(c_url: str, method: str, url: str, out: list, **kw) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=c_url, timeout=120) as c:
            out.append(c.request(method, url, headers=ADMIN, **kw))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _calls(c: httpx.Client) -> int:
    return c.get("/test-only/admin-calls/ml").json()["calls"]


def test_refusable_calls_are_refused_at_once_while_a_load_is_in_flight(tiny_model, tmp_path):
    # a long wait allowed: nothing here may give up for want of a turn, only be refused for what it asks
    with _server(tiny_model, tmp_path, admin_wait_s=600.0) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        (srv.models / "ml" / "7" / "dense").mkdir(parents=True)  # a version being copied: no manifest yet
        with _load_in_flight(srv, c):
            cases = [
                # (a) a label naming a version that does not exist, or is not complete
                ("PUT", "/v1/models/ml/labels/canary", {"json": {"version": 9}}, 404, "no complete version 9"),
                ("PUT", "/v1/models/ml/labels/canary", {"json": {"version": 7}}, 404, "no complete version 7"),
                # (b) :load of a version that does not exist
                ("POST", "/v1/models/ml:load", {"json": {"version": 9}}, 404, "no complete version 9"),
                # (c) bad bodies
                ("PUT", "/v1/models/ml/labels/canary", {"json": {"version": "x"}}, 422, "version"),
                ("POST", "/v1/models/ml:load", {"json": {"vers": 1}}, 422, "unknown field 'vers'"),
                ("POST", "/v1/models/ml:load", {"content": b"{", "headers": {"content-type": "application/json"}}),
                # (d) an unknown model, on every admin route
                ("POST", "/v1/models/nope:load", {"json": {"version": 1}}, 404, "unknown model 'nope'"),
                ("POST", "/v1/models/nope:unload", {}, 404, "unknown model 'nope'"),
                ("POST", "/v1/models/nope:rollback", {}, 404, "unknown model 'nope'"),
                ("PUT", "/v1/models/nope/labels/canary", {"json": {"version": 1}}, 404, "unknown model 'nope'"),
                ("DELETE", "/v1/models/nope/labels/canary", {}, 404, "unknown model 'nope'"),
                # and what the model's state refuses now
                ("DELETE", "/v1/models/ml/labels/canary", {}, 404, "no label 'canary'"),
                ("POST", "/v1/models/ml:rollback", {}, 409, "no previous version"),
                ("PUT", "/v1/models/ml/labels/Bad", {"json": {"version": 1}}, 400, "invalid label"),
            ]
            for case in cases:
                method, url, kw = case[:3]
                status, words = case[3:] if len(case) == 5 else (422, "not valid JSON")
                r, took = _timed(c, method, url, **kw)
                assert r.status_code == status, (method, url, r.text)
                assert words in r.json()["detail"], (method, url, r.text)
                assert took < AT_ONCE_S, f"{method} {url}: {r.status_code} after {took:.2f}s"
                print(f"{method} {url} -> {r.status_code} in {took * 1000:.1f} ms")
            st = _status(c)
            assert st["loading_version"] == 2 and st["loaded"]["version"] == 1  # the load was in flight all along
        wait_for(lambda: _status(c)["loaded"]["version"] == 2, 60, "version 2 serving")
        st = _status(c)
        assert st["labels"] == {} and st["policy"] == "latest"  # none of the refused calls did anything


def test_a_full_admin_queue_answers_429_at_once_and_the_queued_calls_complete(tiny_model, tmp_path):
    with (
        _server(tiny_model, tmp_path, admin_queue=2, admin_wait_s=600.0) as srv,
        httpx.Client(base_url=srv.url, timeout=30) as c,
    ):
        queued: list[httpx.Response] = []
        with _load_in_flight(srv, c):
            threads = [
                _in_background(srv.url, "PUT", "/v1/models/ml/labels/stable", queued, json={"version": 1}),
                _in_background(srv.url, "PUT", "/v1/models/ml/labels/canary", queued, json={"version": 1}),
            ]
            wait_for(lambda: _calls(c) == 2, 30, "two admin calls queued")
            # (e) a third valid call: the queue is full
            r, took = _timed(c, "POST", "/v1/models/ml:load", json={"version": 1})
            print(f"full queue: {r.status_code} in {took * 1000:.1f} ms: {r.json()['detail']}")
            assert r.status_code == 429, r.text
            assert took < AT_ONCE_S, took
            assert int(r.headers["Retry-After"]) >= 1
            detail = r.json()["detail"]
            assert "admin queue is full" in detail and "a load is in progress (model ml version 2)" in detail, detail
            # still refusable calls are refused for what they ask, queue full or not
            r, took = _timed(c, "PUT", "/v1/models/ml/labels/x", json={"version": 9})
            assert r.status_code == 404 and took < AT_ONCE_S, (r.text, took)
            assert queued == [] and _status(c)["loading_version"] == 2
        # (f) once the load is done, the queued calls complete, in order, and the model serves what they asked
        t0 = time.perf_counter()
        for t in threads:
            t.join(120)
        print(f"queued calls done {time.perf_counter() - t0:.2f}s after the load was released")
        assert [r.status_code for r in queued] == [200, 200], [r.text for r in queued]
        st = _status(c)
        assert st["loaded"]["version"] == 2 and st["labels"] == {"stable": 1, "canary": 1}
        assert st["served_versions"] == [2, 1]
        assert _calls(c) == 0
        # the refused call was not done: the model still follows the newest version; retried now, it is done
        assert st["policy"] == "latest"
        r = c.post("/v1/models/ml:load", json={"version": 1}, headers=ADMIN)
        assert r.status_code == 200 and r.json()["policy"] == "pinned" and r.json()["loaded"]["version"] == 1


def test_a_call_whose_turn_does_not_come_in_time_gives_up_having_done_nothing(tiny_model, tmp_path):
    with _server(tiny_model, tmp_path, admin_wait_s=1.0) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        with _load_in_flight(srv, c):
            r, took = _timed(c, "POST", "/v1/models/ml:load", json={"version": 1})
            print(f"turn not in time: {r.status_code} after {took:.2f}s: {r.json()['detail']}")
            assert r.status_code == 429, r.text
            assert 0.9 <= took < 1.0 + AT_ONCE_S, took
            assert r.headers["Retry-After"] == "1"
            assert "did not come within 1s" in r.json()["detail"]
            assert _calls(c) == 0
        wait_for(lambda: _status(c)["loaded"]["version"] == 2, 60, "version 2 serving")
        time.sleep(1.0)  # polls every 0.2 s: a :load 1 that ran after all would pin version 1 by now
        st = _status(c)
        assert st["policy"] == "latest" and st["loaded"]["version"] == 2, st


def test_a_version_that_vanishes_while_its_call_waits_is_refused_when_its_turn_comes(tiny_model, tmp_path):
    with _server(tiny_model, tmp_path, admin_wait_s=600.0) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        copy_version(srv.models / "ml" / "1", srv.models / "ml" / "0")  # an older version: never loaded by the poll
        out: list[httpx.Response] = []
        with _load_in_flight(srv, c):
            t = _in_background(srv.url, "PUT", "/v1/models/ml/labels/old", out, json={"version": 0})
            wait_for(lambda: _calls(c) == 1, 30, "the label call queued")  # version 0 was there when it came
            os.rename(srv.models / "ml" / "0", srv.models / "ml" / ".gone-0")
        t.join(120)
        (r,) = out
        assert r.status_code == 404 and "no complete version 0" in r.json()["detail"], r.text
        st = _status(c)
        assert st["labels"] == {} and st["loaded"]["version"] == 2 and st["served_versions"] == [2]


def test_the_bounds_are_serve_flags(tmp_path):
    from offgraph.cli import build_parser
    from offgraph.cli.settings_flags import settings_from_args
    from offgraph.config import ConfigError
    from offgraph.server import ServerConfig

    parse = build_parser().parse_args
    config = settings_from_args(ServerConfig, parse(["serve", "--models", str(tmp_path)]))
    assert (config.admin_queue, config.admin_wait_s) == (4, 5.0)
    args = parse(["serve", "--models", str(tmp_path), "--admin-queue", "2", "--admin-wait-seconds", "0.5"])
    config = settings_from_args(ServerConfig, args)
    assert (config.admin_queue, config.admin_wait_s) == (2, 0.5)
    with pytest.raises(ConfigError, match="--admin-queue"):
        settings_from_args(ServerConfig, parse(["serve", "--models", str(tmp_path), "--admin-queue", "0"]))
