"""The updater's repeating errors are logged once per interval with the count of the repeats held back
(offgraph.streaming.log_limit), alone on a fake clock and in a real `offgraph update` whose spool
cannot retire what it applied."""

import json
import logging

import numpy as np
import pytest
from kafka_helpers import tiny_export  # noqa: F401 (a fixture)
from streaming_helpers import install_version, make_deltas, publish, run_update

from offgraph.streaming.log_limit import MAX_KEYS, RepeatLimiter


def test_a_repeat_is_held_back_until_the_interval_ends_then_counted(caplog):
    now = [0.0]
    said = RepeatLimiter(logging.getLogger("offgraph.test.limit"), 60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="offgraph.test.limit"):
        assert said.log(logging.WARNING, "disk %s: %s", "/a", "full")
        for i in range(99):  # other arguments, the same message: repeats
            now[0] += 0.1
            assert not said.log(logging.WARNING, "disk %s: %s", f"/a{i}", "full")
        assert said.log(logging.ERROR, "disk %s: %s", "/a", "full")  # another level is another line
        assert said.log(logging.WARNING, "other %s", 1, key="x")  # and another key
        now[0] = 60.0
        assert said.log(logging.WARNING, "disk %s: %s", "/z", "full")
        assert not said.log(logging.WARNING, "disk %s: %s", "/z", "full")
        now[0] = 200.0
        assert said.log(logging.WARNING, "disk %s: %s", "/y", "full")
    msgs = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert msgs == [
        ("WARNING", "disk /a: full"),
        ("ERROR", "disk /a: full"),
        ("WARNING", "other 1"),
        ("WARNING", "disk /z: full (99 more like it in the last 60s)"),
        ("WARNING", "disk /y: full (1 more like it in the last 140s)"),
    ]


def test_the_keys_remembered_are_bounded():
    said = RepeatLimiter(logging.getLogger("offgraph.test.limit"), 60.0, clock=lambda: 0.0)
    for i in range(MAX_KEYS + 10):
        said.log(logging.DEBUG, "m", key=i)
    assert len(said._seen) == MAX_KEYS
    assert said.log(logging.DEBUG, "m", key=0)  # forgotten first: said again
    assert not said.log(logging.DEBUG, "m", key=MAX_KEYS + 9)


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        RepeatLimiter(logging.getLogger("x"), 0)


@pytest.mark.timeout(300)
def test_an_unwritable_spool_is_one_warning_not_one_per_file(tiny_export, tmp_path):
    """A real `offgraph update --once` on a spool whose applied/ cannot be made (a file holds its name):
    every file is applied, and the failure to tidy them away is said once, not once per file."""
    models, spool = tmp_path / "models", tmp_path / "spool"
    install_version(tiny_export, models, 1)
    spool.mkdir()
    (spool / "applied").write_text("not a directory")
    rng = np.random.default_rng(3)
    n = 12
    for i in range(n):
        publish(spool, 1, make_deltas(rng, 4, seq0=4 * i))
    r = run_update(models, spool, "--once", timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(next(x for x in r.stdout.splitlines() if x.startswith('{"update"')))["update"]
    assert summary["files_applied"] == n, summary
    retire = [x for x in r.stderr.splitlines() if "could not retire" in x]
    assert len(retire) == 1 and " WARNING " in retire[0] and "File exists" in retire[0], r.stderr[-3000:]
