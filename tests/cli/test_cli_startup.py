"""`offgraph` start-up and output: `--help` and `update` load no TensorFlow, TensorFlow's C++ start-up
lines and its Python loggers' INFO and WARNING lines are hidden unless `-v`, `train` prints each epoch
once, `export` and `synth` their summary once, `--log-format json` lines parse. Every check runs a
fresh Python (the test process has TensorFlow loaded by other tests)."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tf_noise import TF_NOISE

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("tensorflow", "keras", "numpy", "pyarrow", "rocksdict")
# what TensorFlow's C++ code says while it is imported, before any log level applies


def _python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env
    )


def _offgraph(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "offgraph.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _env_without_tf_log_level() -> dict:
    """The environment of a user who set nothing (conftest sets TF_CPP_MIN_LOG_LEVEL for the tests)."""
    return {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def test_help_builds_every_subcommand_without_heavy_imports():
    r = _python(
        "import json, sys; import offgraph.cli\n"
        "try:\n    offgraph.cli.main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0, e.code\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert json.loads(lines[-1]) == [], "offgraph --help imported " + lines[-1]
    listed = re.search(r"\{([a-z,-]+)\}", r.stdout)
    assert listed and listed[1].split(",") == [
        "data",
        "train",
        "spec",
        "export",
        "check",
        "import",
        "synth",
        "features",
        "serve",
        "plan",
        "update",
        "stream-train",
        "prune",
        "experiment",
    ], r.stdout[:1000]


def test_help_is_fast():
    t0 = time.perf_counter()
    r = _offgraph("--help")
    took = time.perf_counter() - t0
    assert r.returncode == 0 and "update" in r.stdout, r.stderr[-2000:]
    # the target is < 0.5 s; the bound leaves room for a loaded test machine, and TensorFlow alone takes
    # several seconds to import
    assert took < 2.0, f"offgraph --help took {took:.2f} s"


@pytest.mark.parametrize("cmd", ["update", "serve", "data", "train", "export", "check"])
def test_subcommand_help_loads_no_tensorflow(cmd):
    r = _python(
        "import sys; import offgraph.cli\n"
        f"try:\n    offgraph.cli.main([{cmd!r}, '--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "False False", r.stdout[-500:]


def test_updater_modules_load_no_tensorflow():
    r = _python(
        "import sys, offgraph.cli.update, offgraph.streaming.updater, offgraph.streaming.sources, offgraph.streaming.metrics, "
        "offgraph.streaming.live_version\nprint(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "[]"


def test_library_scorer_check_and_stream_train_load_no_http_code():
    """The request path lives under server/, but the library scorer, `offgraph check` and the stream
    trainer must not pull in the HTTP app (FastAPI, uvicorn, the app's modules), nor start anything."""
    r = _python(
        "import sys, threading, offgraph.scoring.scorer, offgraph.export.check, offgraph.streaming.stream_train\n"
        "from offgraph.scoring.scorer import Scorer, load\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'uvicorn')\n"
        "             or m in ('offgraph.server.app', 'offgraph.server.models.registry', 'offgraph.server.models.loader', 'offgraph.server.process.workers')))\n"
        "print(threading.active_count())"
    )
    assert r.returncode == 0, r.stderr[-2000:]
    http, threads = r.stdout.strip().splitlines()[-2:]
    assert http == "[]", "the library scorer imported " + http
    assert int(threads) == 1, f"importing the library scorer started {int(threads) - 1} threads"


def test_choices_read_lazily_are_still_checked(tmp_path):
    r = _offgraph("export", "--run", str(tmp_path), "--out", str(tmp_path / "m"), "--quant", "int4")
    assert r.returncode == 2 and "invalid choice: 'int4'" in r.stderr and "'int8'" in r.stderr, r.stderr
    r = _offgraph("data", "nope", "--out", str(tmp_path))
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr and "movielens-100k" in r.stderr, r.stderr
    r = _offgraph("train", "--help")
    assert r.returncode == 0 and "per-key-time" in r.stdout, r.stdout


FAKE_TF = """
import os
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
os.write(2, b"I0000 00:00:1796054335.381589   17966 port.cc:153] oneDNN custom operations are on.\\n")
os.write(2, b"E0000 00:00:1796054335.381589   17966 real.cc:1] a real error line\\n")
if os.environ.get("FAKE_TF_FAIL"):
    raise ImportError("fake TensorFlow is broken")
"""


@pytest.mark.parametrize("fail", [False, True])
def test_quiet_import_drops_only_the_start_up_noise(tmp_path, fail):
    """The import hook on a stand-in `tensorflow` package that writes to fd 2 like TensorFlow does."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(FAKE_TF)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "FAKE_TF_FAIL": "1" if fail else ""}
    r = _python(
        "import sys; import offgraph.cli\noffgraph.cli.install_quiet_tensorflow_import()\n"
        "try:\n    import tensorflow\nexcept ImportError as e:\n    print('import failed:', e)\n"
        "print('after', file=sys.stderr)",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "a real error line" in r.stderr and r.stderr.rstrip().endswith("after")
    if fail:  # nothing hidden: the noise may explain the failure
        assert "import failed: fake TensorFlow is broken" in r.stdout
        assert "oneDNN" in r.stderr and "absl::InitializeLog" in r.stderr
    else:
        assert not TF_NOISE.search(r.stderr), r.stderr


def test_tensorflow_start_up_lines_hidden_unless_verbose_and_epochs_printed_once(movielens_table, tmp_path):
    """A real `offgraph train` (TensorFlow imported): without -v no C++ start-up line; with -v they are
    there; each epoch is one line of the output, not a log line plus a print."""
    import pyarrow.parquet as pq

    env = _env_without_tf_log_level()
    raw = _python("import tensorflow", env=env)
    assert raw.returncode == 0, raw.stderr[-2000:]
    if not TF_NOISE.search(raw.stderr):
        pytest.skip("this TensorFlow build prints nothing when imported")
    data = tmp_path / "ml.parquet"
    pq.write_table(movielens_table.slice(0, 3000), data)
    args = [
        "train",
        "--spec",
        str(REPO / "examples" / "movielens.yaml"),
        "--data",
        str(data),
        "--epochs",
        "2",
        "--batch-size",
        "512",
        "--no-progress",
    ]

    quiet = _offgraph(*args, "--out", str(tmp_path / "run1"), env=env)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert not TF_NOISE.search(quiet.stderr), quiet.stderr[-3000:]
    both = quiet.stdout + quiet.stderr
    for epoch in (1, 2):
        assert len(re.findall(rf"\bepoch {epoch}\b", both)) == 1, both[-3000:]
    assert "held-out:" in quiet.stdout

    loud = _offgraph("-v", *args, "--out", str(tmp_path / "run2"), env=env)
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert TF_NOISE.search(loud.stderr), loud.stderr[-3000:]


def test_update_applies_deltas_without_loading_tensorflow(tiny_model, tmp_path):
    """`offgraph update --once` on a real export and a real spool file, in a fresh process."""
    import shutil

    from offgraph.streaming.deltas import publish_delta

    models = tmp_path / "models"
    shutil.copytree(tiny_model[0], models)
    spool = tmp_path / "spool"
    spool.mkdir()
    k = 5
    publish_delta(
        spool,
        model="ml",
        model_version=1,
        table_ids=np.zeros(k, np.uint32),
        rows=np.arange(k),
        vectors=np.ones((k, 16), np.float32),
        first_order=np.ones(k, np.float32),
        seqs=np.arange(k),
        event_time_ms=int(time.time() * 1000),
    )
    argv = ["update", "--models", str(models), "--model", "ml", "--source", f"spool:{spool}", "--once"]
    r = _python(
        "import sys; import offgraph.cli\n"
        f"rc = offgraph.cli.main({argv!r})\n"
        "print('tensorflow loaded:', 'tensorflow' in sys.modules)\nsys.exit(rc)"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith('{"update"')))["update"]
    assert summary["files_applied"] == 1 and summary["rows_applied"] == k, summary
    assert "tensorflow loaded: False" in r.stdout


@pytest.mark.parametrize(
    "flag, value, words",
    [
        ("--optimizer", "adam", "StreamTrainConfig.optimizer (--optimizer) must be 'sgd' or 'adagrad', got 'adam'"),
        (
            "--time-unit",
            "days",
            "StreamTrainConfig.time_unit (--time-unit) must be 'auto', 's', 'ms', 'us' or 'ns', got 'days'",
        ),
        ("--batch-size", "0", "StreamTrainConfig.batch_size (--batch-size) must be greater than or equal to 1, got 0"),
    ],
)
def test_stream_train_names_a_bad_choice(tmp_path, flag, value, words):
    """Settings are checked by StreamTrainConfig (pydantic, no TensorFlow) before anything is read: a
    clear one-line error naming the flag, exit 2, no traceback."""
    r = _offgraph(
        "stream-train",
        "--model",
        str(tmp_path / "m"),
        "--events",
        str(tmp_path / "e.parquet"),
        "--emit",
        f"spool:{tmp_path / 'spool'}",
        flag,
        value,
    )
    assert r.returncode == 2 and f"offgraph stream-train: error: {words}" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


# a line of TensorFlow's or absl's Python loggers, in the text format
TF_PY_LINE = re.compile(r"^\S+ \S+ (INFO|WARNING) (absl|tensorflow): ", re.M)
SYNTH = ["--rows", "40000", "--shards", "2", "--no-progress"]  # the smallest synth version


def _quiet_and_loud(args: list[str], out: Path, summary: str) -> None:
    env = _env_without_tf_log_level()
    quiet = _offgraph(*args, "--out", str(out / "q" / "1"), env=env)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert not TF_NOISE.search(quiet.stderr), quiet.stderr[-3000:]
    assert not TF_PY_LINE.search(quiet.stderr), quiet.stderr[-3000:]
    both = quiet.stdout + quiet.stderr
    assert len(re.findall(summary, both)) == 1, both[-3000:]  # printed, not also logged
    assert re.search(summary, quiet.stdout), quiet.stdout

    loud = _offgraph("-v", *args, "--out", str(out / "v" / "1"), env=env)
    assert loud.returncode == 0, loud.stderr[-3000:]
    assert TF_PY_LINE.search(loud.stderr), loud.stderr[-3000:]  # -v hides nothing


@pytest.mark.timeout(600)
def test_synth_says_its_summary_once_and_no_tensorflow_lines_unless_verbose(tmp_path):
    _quiet_and_loud(["synth", *SYNTH], tmp_path, r"synth -> \S+: 16 tables")


@pytest.mark.timeout(600)
def test_export_says_its_summary_once_and_no_tensorflow_lines_unless_verbose(tiny_model, tmp_path):
    run = tiny_model[0].parent / "run"
    _quiet_and_loud(["export", "--run", str(run), "--shards", "2", "--no-progress"], tmp_path, r"exported \S+ -> ")


def test_json_log_lines_parse_and_carry_their_extra_fields():
    """The JSON format (offgraph.log_format, as `--log-format json` sets it up): a line logged with
    ``extra`` carries the field, an exception its traceback. Serving's lines: tests/server/test_ops_startup.py."""
    code = (
        "import logging\n"
        "from offgraph.log_format import configure_logging\n"
        "configure_logging(logging.INFO, 'json')\n"
        "logging.getLogger('offgraph.x').warning('hello %s', 'there', extra={'request_id': 'r-1'})\n"
        "try:\n    1 / 0\nexcept ZeroDivisionError:\n    logging.getLogger('offgraph.x').exception('boom')\n"
        "logging.getLogger('offgraph.x').info('outside', extra={'request_id': None})\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stderr.splitlines()]
    hello, boom, outside = lines
    assert "request_id" not in outside, outside  # a field that is None is absent
    assert hello["level"] == "WARNING" and hello["logger"] == "offgraph.x" and hello["request_id"] == "r-1", hello
    assert hello["message"] == "hello there"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", hello["time"]), hello
    assert boom["level"] == "ERROR" and "ZeroDivisionError" in boom["exc_info"], boom


def test_a_bad_log_format_is_refused():
    r = _offgraph("--log-format", "xml", "synth", "--out", "x")
    assert r.returncode == 2 and "--log-format" in r.stderr and "text" in r.stderr, r.stderr


def test_json_lines_of_a_request_carry_its_id_once():
    """A record made during a request (the server's log tag: text lines end with ``[request_id=ID]``) gives a
    JSON line whose ``request_id`` field holds the id and whose message does not repeat it."""
    code = (
        "import logging\n"
        "from offgraph.log_format import configure_logging\n"
        "from offgraph.server.http.request_id import REQUEST_ID, install_log_tag\n"
        "configure_logging(logging.INFO, 'json')\n"
        "install_log_tag()\n"
        "REQUEST_ID.set('r-2')\n"
        "logging.getLogger('offgraph.x').warning('in a request %d', 7)\n"
    )
    r = _python(code)
    assert r.returncode == 0, r.stderr
    (line,) = [json.loads(x) for x in r.stderr.splitlines()]
    assert line["request_id"] == "r-2" and line["message"] == "in a request 7", line
