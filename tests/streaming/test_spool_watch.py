"""The spool's wake-up: inotify ends a wait as soon as a delta file lands (real inotify, real files)."""

import os
import threading
import time

import pytest

from offgraph.streaming.spool.watch import DirWatch, SleepWatch

ACCEPT = lambda name: name.endswith(".delta.arrow") and not name.startswith(".")  # noqa: E731


@pytest.fixture
def watch(tmp_path):
    w = DirWatch.open(tmp_path, ACCEPT)
    assert w.mode == "inotify", "these tests need Linux inotify"
    yield w
    w.close()


def _waited(w, timeout) -> float:
    t0 = time.monotonic()
    w.wait(timeout)
    return time.monotonic() - t0


def _land(path, rename=True):
    if rename:  # as publish_delta does: a hidden file renamed in
        tmp = path.with_name("." + path.name)
        tmp.write_bytes(b"x")
        os.replace(tmp, path)
    else:
        path.write_bytes(b"x")


def _wait_in_thread(w, timeout):
    """Start ``w.wait(timeout)`` in a thread; (thread, a list that gets the time it returned)."""
    ended: list[float] = []
    th = threading.Thread(target=lambda: (w.wait(timeout), ended.append(time.monotonic())))
    th.start()
    return th, ended


@pytest.mark.parametrize("rename", [True, False], ids=["renamed-in", "written-in-place"])
def test_a_delta_file_landing_ends_the_wait_at_once(watch, tmp_path, rename):
    th, ended = _wait_in_thread(watch, 20.0)
    th.join(0.2)  # nothing has landed: the wait goes on
    assert th.is_alive() and not ended
    landed = time.monotonic()
    _land(tmp_path / "001.delta.arrow", rename)
    th.join(10.0)
    assert ended and ended[0] - landed < 5.0  # woken by the file, not by the 20-s timeout


def test_a_file_that_landed_before_the_wait_is_not_missed(watch, tmp_path):
    (tmp_path / "002.delta.arrow").write_bytes(b"x")  # between the reader's listing and its wait
    assert _waited(watch, 20.0) < 1.0


def test_temporary_and_hidden_files_do_not_wake_it(watch, tmp_path):
    (tmp_path / "003.delta.arrow.tmp").write_bytes(b"x")
    (tmp_path / ".publish-1.delta.arrow").write_bytes(b"x")
    assert _waited(watch, 0.5) >= 0.45


def test_interrupt_from_another_thread_ends_the_wait(watch):
    th, ended = _wait_in_thread(watch, 20.0)
    th.join(0.2)
    assert th.is_alive() and not ended
    asked = time.monotonic()
    watch.interrupt()
    th.join(10.0)
    assert ended and ended[0] - asked < 5.0


def test_no_inotify_falls_back_to_sleeping(tmp_path, caplog):
    w = DirWatch.open(tmp_path / "missing", ACCEPT)  # inotify_add_watch fails: ENOENT
    assert isinstance(w, SleepWatch) and w.mode == "poll"
    assert "polling instead" in caplog.text
    assert _waited(w, 0.3) >= 0.25
    th, ended = _wait_in_thread(w, 20.0)
    th.join(0.1)
    assert th.is_alive() and not ended
    asked = time.monotonic()
    w.interrupt()
    th.join(10.0)
    assert ended and ended[0] - asked < 5.0
