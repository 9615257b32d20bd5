"""Every `offgraph` subcommand runs from an installed wheel, outside the repository.

The wheel is built from this checkout's package (pyproject.toml, README.md and offgraph/ only: nothing else
of the repository can come along) and installed without its dependencies into a fresh venv; the
dependencies (TensorFlow, ...) come from the test interpreter's site-packages, appended to the venv's
``sys.path`` by a plain ``.pth`` line (so the editable install of this checkout there is not activated).
Every command runs in a temporary folder with no PYTHONPATH: only the wheel provides ``offgraph``, and
nothing of the repository (``bench``, ``tests``) is importable. A command that imports a module the wheel
lacks fails here (``offgraph plan`` once imported ``bench.scale_traffic``: issue 48).

The subcommands are enumerated from the real argparse parser, nested ones included (``spec check``):
each must have a case in ``CASES`` (a test fails for one that has none). Each case runs the command on a
small real input (MovieLens from ``offgraph data``, a tiny training run, its export, a small synthetic
version) and checks its exit code and that it printed no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Callable, Iterator
from functools import cached_property
from pathlib import Path

import pytest
from package_wheel import build_wheel

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "movielens.yaml"
TRAIN_ROWS = 4000  # MovieLens rows the tiny run trains on (one epoch)

pytestmark = pytest.mark.slow  # builds a wheel, runs every subcommand in a child process


def leaf_commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable command of the parser, as its words: ``("plan",)``, ``("spec", "check")``, ..."""
    if parser is None:
        from offgraph.cli import build_parser

        parser = build_parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [leaf for a in subs for name, p in a.choices.items() for leaf in leaf_commands(p, (*prefix, name))]


def _no_traceback(r: subprocess.CompletedProcess | str, what: str) -> None:
    out = r if isinstance(r, str) else (r.stdout or "") + (r.stderr or "")
    for bad in ("Traceback (most recent call last)", "ModuleNotFoundError", "ImportError"):
        assert bad not in out, f"{what} printed {bad!r}:\n{out[-4000:]}"


class Installed:
    """The wheel installed in a venv, and the inputs the cases share, each made once, by the installed CLI."""

    def __init__(self, root: Path):
        self.root = root
        wheel = build_wheel(root)
        env = root / "venv"
        venv.create(env, with_pip=False)
        self.python = env / "bin" / "python"
        self.offgraph = env / "bin" / "offgraph"
        # the test interpreter's pip installs into the venv's interpreter (no pip in the venv: faster)
        r = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(self.python), "install", "--no-deps", "--no-index", "-q"]
            + [str(wheel)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, r.stderr[-3000:]
        self.site = Path(self._python_out("import sysconfig; print(sysconfig.get_paths()['purelib'])"))
        # the dependencies: the test interpreter's site-packages, after the venv's own. A plain path line:
        # the .pth files there (this checkout's editable install among them) are not run
        self.deps = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
        (self.site / "zz_offgraph_test_dependencies.pth").write_text("".join(f"{p}\n" for p in self.deps))
        self.work = root / "work"  # every command's working directory: outside the checkout
        self.work.mkdir()
        data_root = os.environ.get("OFFGRAPH_DATA_DIR") or str(REPO.parent / "shared" / "data")  # conftest's
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
        self.env.update(
            PATH=f"{env / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            VIRTUAL_ENV=str(env),
            OFFGRAPH_DATA_DIR=data_root,
            TF_CPP_MIN_LOG_LEVEL="2",
        )

    def _python_out(self, code: str) -> str:
        r = subprocess.run(
            [str(self.python), "-c", code],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.strip()

    def run(self, *args: str | Path, rc: int = 0, timeout: float = 240) -> subprocess.CompletedProcess:
        """``offgraph *args`` (the installed script) in the work folder; asserts its exit code ``rc`` and
        that it printed no traceback."""
        argv = [str(a) for a in args]
        r = subprocess.run(
            [str(self.offgraph), *argv], cwd=self.work, capture_output=True, text=True, timeout=timeout, env=self.env
        )
        what = "offgraph " + " ".join(argv)
        assert r.returncode == rc, f"{what}: exit {r.returncode}, not {rc}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
        _no_traceback(r, what)
        return r

    # the shared inputs, made the first time a case needs them

    @cached_property
    def movielens(self) -> Path:
        """``offgraph data movielens-100k``: the flat table."""
        out = self.work / "ml-data"
        self.run("data", "movielens-100k", "--out", out)
        (table,) = out.glob("*.parquet")
        return table

    @cached_property
    def small(self) -> Path:
        """The first TRAIN_ROWS rows of the MovieLens table."""
        import pyarrow.parquet as pq

        path = self.work / "small.parquet"
        pq.write_table(pq.read_table(self.movielens).slice(0, TRAIN_ROWS), path)
        return path

    @cached_property
    def train_run(self) -> Path:
        """``offgraph train``: one epoch on ``small``."""
        out = self.work / "run"
        r = self.run("train", "--spec", SPEC, "--data", self.small, "--out", out, "--epochs", "1", "--validation", "0")
        assert "held-out AUC" in r.stdout + r.stderr
        assert (out / "model.weights.h5").is_file()
        return out

    @cached_property
    def models(self) -> Path:
        """``offgraph export`` of ``train_run`` to MODELS/ml/1, with its feature tables and a hot set."""
        models = self.work / "models"
        self.run("export", "--run", self.train_run, "--out", models / "ml" / "1", "--shards", "2")
        return models

    @cached_property
    def synth_models(self) -> Path:
        """``offgraph synth``: a small synthetic version, SYNTH/syn/1."""
        models = self.work / "synth"
        self.run("synth", "--out", models / "syn" / "1", "--rows", "5e4", "--shards", "2", "--workers", "1")
        assert (models / "syn" / "1" / "manifest.json").is_file()
        return models


# the cases, by command words: each runs the command on a real input (the Installed's shared ones)
CASES: dict[tuple[str, ...], Callable[[Installed], None]] = {}


def case(*words: str):
    def register(fn):
        CASES[words] = fn
        return fn

    return register


@case("data")
def _data(i: Installed) -> None:
    import pyarrow.parquet as pq

    assert pq.read_metadata(i.movielens).num_rows == 100_000
    i.run("data", "no-such-dataset", "--out", i.work / "nothing", rc=2)


@case("train")
def _train(i: Installed) -> None:
    assert json.loads((i.train_run / "metrics.json").read_text())


@case("spec", "check")
def _spec_check(i: Installed) -> None:
    r = i.run("spec", "check", SPEC, "--data", i.small)
    assert "ok" in r.stdout
    bad = i.work / "bad.yaml"
    bad.write_text("model: {embedding_dim: 8}\nlabel: label\nfields: []\n")
    i.run("spec", "check", bad, rc=2)


@case("spec", "schema")
def _spec_schema(i: Installed) -> None:
    assert json.loads(i.run("spec", "schema").stdout)["type"] == "object"


@case("export")
def _export(i: Installed) -> None:
    version = i.models / "ml" / "1"
    assert (version / "manifest.json").is_file() and (version / "dense").is_dir()


@case("check")
def _check(i: Installed) -> None:
    r = i.run("check", "--model", i.models / "ml" / "1", "--run", i.train_run, "--data", i.small, "--limit", "300")
    assert "FAIL" not in r.stdout, r.stdout


@case("import")
def _import(i: Installed) -> None:
    """A tiny model made here (tables of random rows, a one-layer Keras head), imported and checked on 300 rows."""
    import keras
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = i.work / "import-src"
    (root / "tables").mkdir(parents=True)
    movies = sorted({str(m) for m in pq.read_table(i.small, columns=["movie_id"]).column(0).to_pylist()})
    (root / "movie.txt").write_text("".join(f"{m}\n" for m in movies))
    (root / "spec.yaml").write_text(
        "model: {embedding_dim: 4}\nlabel: label\nfields:\n"
        "  - {name: user, scope: request, op: id, input: user_id, rows: 50}\n"
        "  - {name: movie, scope: item, op: id, input: movie_id, vocabulary: movie.txt}\n"
    )
    rng = np.random.default_rng(0)
    for name, rows in (("user", 50), ("movie", len(movies) + 1)):
        vectors = rng.normal(0, 0.1, (rows, 4)).astype(np.float32)
        t = {
            "row": np.arange(rows),
            "vector": pa.array(list(vectors), pa.list_(pa.float32())),
            "first_order": rng.normal(0, 0.1, rows),
        }
        pq.write_table(pa.table(t), root / "tables" / f"{name}.parquet")
    emb, fo = keras.Input((2, 4)), keras.Input((2,))
    flat = keras.layers.Concatenate()([keras.layers.Flatten()(emb), fo])
    keras.Model([emb, fo], keras.layers.Dense(1)(flat)).save(root / "head.keras")
    sample = i.work / "import-sample.parquet"
    pq.write_table(pq.read_table(i.small).slice(0, 300), sample)
    out = i.work / "imported" / "tiny" / "1"
    args = ["import", "--spec", root / "spec.yaml", "--tables", root / "tables", "--dense", root / "head.keras"]
    r = i.run(*args, "--out", out, "--shards", "2", "--no-progress", "--check-rows", sample)
    assert "check on 300 rows" in r.stdout, r.stdout
    r = i.run("check", "--model", out, "--data", sample)
    assert "OK: max |dp|" in r.stdout, r.stdout
    i.run(*args[:-1], root / "spec.yaml", "--out", i.work / "imported" / "tiny" / "2", rc=2)  # not a head: one line


@case("synth")
def _synth(i: Installed) -> None:
    assert (i.synth_models / "syn" / "1" / "store").is_dir()


@case("features", "load")
def _features_load(i: Installed) -> None:
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(i.small, columns=["user_id", "age", "gender", "occupation", "zip_prefix"])
    _, first = np.unique(t["user_id"].to_numpy(), return_index=True)
    users = i.work / "users.parquet"
    pq.write_table(t.take(first), users)
    r = i.run("features", "load", "--model", i.models / "ml", "--table", "user", "--data", users)
    assert f"loaded {len(first)} rows" in r.stdout


@contextlib.contextmanager
def _served(i: Installed, name: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """The installed ``offgraph serve`` on the exported models (one worker), its URL; stopped with SIGTERM, which
    must be a graceful stop (exit status 0, the drain's line, no traceback in its log ``name``.log)."""
    from offgraph.testing.harness import free_port, wait_ready

    port = free_port()
    log = i.work / f"{name}.log"
    cmd = [str(i.offgraph), "serve", "--models", str(i.models), "--port", str(port), "--workers", "1", *flags]
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, cwd=i.work, stdout=logf, stderr=subprocess.STDOUT, env={**i.env, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, 120, proc, log=str(log))
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    out = log.read_text()
    # a graceful stop, its drain included (offgraph.server.process.graceful_stop): exit status 0
    assert proc.returncode == 0 and "Application shutdown complete" in out, out[-4000:]
    _no_traceback(out, "offgraph serve")


BODY = {"request": {"user_id": 196}, "candidates": [{"movie_id": 242}, {"movie_id": 302}]}


@case("serve")
def _serve(i: Installed) -> None:
    import httpx

    with _served(i, "serve") as url:
        r = httpx.post(f"{url}/v1/models/ml:score", json=BODY, timeout=30)
        assert r.status_code == 200, r.text
        assert len(r.json()["scores"]) == 2


TOKEN = "installed-cli-token"


def _experiment(i: Installed, action: str) -> None:
    """``offgraph experiment set``, ``show`` and ``clear`` against the installed server, in that order; ``action``:
    the one whose case this is (the others run around it, as a user would)."""
    import httpx

    with _served(i, f"experiment-{action}", env={"OFFGRAPH_ADMIN_TOKEN": TOKEN}) as url:
        common = ["--url", url, "--model", "ml", "--admin-token", TOKEN]
        r = i.run(
            "experiment", "set", *common, "--arm", "version=1:0.5", "--arm", "prior:0.5", "--sticky-key", "user_id"
        )
        assert [a["arm"] for a in json.loads(r.stdout)["arms"]] == ["v1", "prior"], r.stdout
        scored = httpx.post(f"{url}/v1/models/ml:score", json=BODY, timeout=30).json()
        assert scored["arm"] in ("v1", "prior"), scored
        shown = json.loads(i.run("experiment", "show", *common).stdout)
        assert shown["sticky_key"] == "user_id", shown
        i.run("experiment", "clear", *common)
        assert "httpx" not in r.stderr, r.stderr  # quiet: no line per HTTP request
        assert "arm" not in httpx.post(f"{url}/v1/models/ml:score", json=BODY, timeout=30).json()
        i.run(
            "experiment",
            action,
            "--url",
            url,
            "--model",
            "ml",
            "--admin-token",
            "wrong",
            *(["--arm", "prior:1", "--sticky-key", "user_id"] if action == "set" else []),
            rc=2,
        )  # a wrong token: the server's 401, one line, exit status 2


for _action in ("set", "show", "clear"):
    case("experiment", _action)(lambda i, _a=_action: _experiment(i, _a))


@case("experiment", "report")
def _experiment_report(i: Installed) -> None:
    """The installed server logs what it served (an experiment of v1 and the prior arm), the installed report joins
    it with outcomes: each request's first candidate clicked, so every arm's CTR is 1/2 and its UCTR 1."""
    import httpx
    import pyarrow as pa
    import pyarrow.parquet as pq

    served = i.work / "served-log"
    flags = ("--served-log-rate", "1", "--served-log-dir", str(served))
    with _served(i, "experiment-report", *flags, env={"OFFGRAPH_ADMIN_TOKEN": TOKEN}) as url:
        common = ["--url", url, "--model", "ml", "--admin-token", TOKEN, "--sticky-key", "user_id"]
        i.run("experiment", "set", *common, "--arm", "version=1:0.5", "--arm", "prior:0.5")
        for u in range(40):
            body = {"request": {"user_id": 100 + u}, "candidates": [{"movie_id": 242}, {"movie_id": 302}]}
            r = httpx.post(f"{url}/v1/models/ml:score", json=body, headers={"x-request-id": f"req-{u}"}, timeout=30)
            assert r.status_code == 200, r.text
    # the stop wrote what was queued
    outcomes = i.work / "outcomes.parquet"
    ids = [f"req-{u}" for u in range(40)]
    table = {"request_id": ids, "movie_id": [242] * 40, "event": ["click"] * 40, "value": [1.0] * 40}
    pq.write_table(pa.table(table), outcomes)
    out = i.work / "report.json"
    cmd = ["experiment", "report", "--served", served, "--outcomes", outcomes, "--item-field", "movie_id"]
    r = i.run(*cmd, "--json", out, "--draws", "50")
    report = json.loads(out.read_text())
    assert set(report["arms"]) == {"v1", "prior"}, r.stdout
    for arm in report["arms"].values():
        assert arm["ctr"]["value"] == 0.5 and arm["uctr"]["value"] == 1.0, arm
    assert sum(a["requests"] for a in report["arms"].values()) == 40, report
    i.run("experiment", "report", "--served", served, "--outcomes", i.work / "none.parquet", rc=2)


@case("plan")
def _plan(i: Installed) -> None:
    # the command of issue 48, word for word
    r = i.run("plan", "--rows", "1e8", "--disk-ms-qd1", "0.1", "--disk-ms-qd8", "0.3", "--disk-iops-qd8", "30000")
    assert "predicted read time per request" in r.stdout


@case("update")
def _update(i: Installed) -> None:
    spool = i.work / "empty-spool"
    spool.mkdir()
    r = i.run("update", "--models", i.models, "--model", "ml", "--source", f"spool:{spool}", "--once")
    assert json.loads(r.stdout.strip().splitlines()[-1])["update"]["deltas"] == 0


@case("stream-train")
def _stream_train(i: Installed) -> None:
    import pyarrow.parquet as pq

    events = i.work / "events.parquet"
    pq.write_table(pq.read_table(i.movielens).slice(TRAIN_ROWS, 300), events)
    spool = i.work / "stream-spool"
    r = i.run("stream-train", "--model", i.models / "ml" / "1", "--events", events, "--emit", f"spool:{spool}")
    assert "300 events" in r.stdout + r.stderr
    # the deltas apply (to a copy: the other cases keep the exported rows)
    models = i.work / "models-streamed"
    shutil.copytree(i.models, models)
    r = i.run("update", "--models", models, "--model", "ml", "--source", f"spool:{spool}", "--once")
    assert json.loads(r.stdout.strip().splitlines()[-1])["update"]["rows_applied"] > 0


@case("prune")
def _prune(i: Installed) -> None:
    models = i.work / "synth-prune"
    shutil.copytree(i.synth_models / "syn" / "1", models / "syn" / "1")
    shutil.copytree(i.synth_models / "syn" / "1", models / "syn" / "2")
    r = i.run("prune", "--models", models, "--model", "syn", "--keep", "1", "--dry-run")
    assert "would prune 1 version" in r.stdout, r.stdout
    i.run("prune", "--models", models, "--model", "syn", "--keep", "1")
    assert sorted(p.name for p in (models / "syn").iterdir()) == ["2"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Installed:
    return Installed(tmp_path_factory.mktemp("installed-cli"))


def test_only_the_wheel_provides_offgraph(installed):
    """In the work folder, ``offgraph`` is the venv's copy; the repository's modules are not importable;
    the installed parser has the same subcommands as this checkout's."""
    code = (
        "import importlib.util, json, offgraph, offgraph.cli, sys\n"
        "from pathlib import Path\n"
        "print(json.dumps({'offgraph': offgraph.__file__, 'sys_path': sys.path,\n"
        "    'absent': [m for m in ('bench', 'tests', 'streaming_helpers') if importlib.util.find_spec(m) is None]}))"
    )
    r = subprocess.run(
        [str(installed.python), "-c", code],
        cwd=installed.work,
        capture_output=True,
        text=True,
        timeout=120,
        env=installed.env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout)
    assert Path(got["offgraph"]).is_relative_to(installed.site), got["offgraph"]
    # nothing of the checkout is on the path but the dependencies' folder (when the test venv is inside it)
    inside = [
        p for p in got["sys_path"] if p not in installed.deps and (installed.work / p).resolve().is_relative_to(REPO)
    ]
    assert inside == [], got["sys_path"]
    assert got["absent"] == ["bench", "tests", "streaming_helpers"]
    # the installed parser's commands, by this module's own function run in the venv's interpreter
    code = f"import argparse, json\n{inspect.getsource(leaf_commands)}\nprint(json.dumps(leaf_commands()))"
    listed = subprocess.run(
        [str(installed.python), "-c", code],
        cwd=installed.work,
        capture_output=True,
        text=True,
        timeout=120,
        env=installed.env,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    assert [tuple(c) for c in json.loads(listed.stdout)] == leaf_commands()


def test_every_case_is_a_subcommand():
    stale = sorted(set(CASES) - set(leaf_commands()))
    assert stale == [], f"cases of commands the parser does not have: {stale}"


@pytest.mark.parametrize("command", leaf_commands(), ids=" ".join)
def test_subcommand_runs_from_the_installed_wheel(installed, command):
    run = CASES.get(command)
    assert run is not None, (
        f"`offgraph {' '.join(command)}` has no case in {Path(__file__).name}'s CASES: add one that runs it "
        "on a small real input"
    )
    run(installed)
