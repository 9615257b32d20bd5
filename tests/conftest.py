import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# NumPy's BLAS at one thread, as `offgraph serve` sets it (--blas-threads 1), here and in the processes the tests
# start: a library Scorer in a test then scores through the dense head a server worker does (the NumPy head at
# every candidate count: offgraph.scoring.numpy_head), so "the server scores as the library" compares like with like
os.environ["OPENBLAS_NUM_THREADS"] = "1"
from threadpoolctl import threadpool_limits  # noqa: E402 (after the environment it reads)

threadpool_limits(limits=1, user_api="blas")  # numpy may be loaded already (a plugin): its OpenBLAS too

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def movielens_table(tmp_path_factory):
    """The real MovieLens-100k flat table (built once per test session)."""
    import pyarrow.parquet as pq

    from offgraph.data.datasets import build

    out = tmp_path_factory.mktemp("ml")
    return pq.read_table(build("movielens-100k", out))


@pytest.fixture(scope="session")
def small_run(movielens_table, tmp_path_factory):
    """A DeepFM trained for 1 epoch on the first 30k MovieLens ratings: (run_dir, table)."""
    from offgraph.features import load_spec
    from offgraph.model.train import TrainConfig, train_run

    spec = load_spec(REPO / "examples" / "movielens.yaml")
    table = movielens_table.slice(0, 30000)
    run = tmp_path_factory.mktemp("run") / "run"
    train_run(spec, table, TrainConfig(epochs=1, split="per-key-time"), run, progress=False)
    return run, table


@pytest.fixture(scope="session")
def numeric_run(movielens_table, tmp_path_factory):
    """Like ``small_run`` with examples/movielens_numeric.yaml (a standardized continuous field): (run_dir, table)."""
    from offgraph.features import load_spec
    from offgraph.model.train import TrainConfig, train_run

    spec = load_spec(REPO / "examples" / "movielens_numeric.yaml")
    table = movielens_table.slice(0, 30000)
    run = tmp_path_factory.mktemp("numeric_run") / "run"
    train_run(spec, table, TrainConfig(epochs=1, split="per-key-time"), run, progress=False)
    return run, table


@pytest.fixture(scope="session")
def tiny_model(movielens_table, tmp_path_factory):
    """(pristine MODELS dir holding ml/1, the table slice): a 1-epoch DeepFM with tables 1/50 of the example's."""
    import yaml

    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:  # numeric fields have no table
            f["rows"] = max(16, f["rows"] // 50)
    spec = parse_spec(raw, source="tiny movielens")
    table = movielens_table.slice(0, 8000)
    root = tmp_path_factory.mktemp("server_model")
    train_run(spec, table, TrainConfig(epochs=1, batch_size=512, split="per-key-time"), root / "run", progress=False)
    export_run(root / "run", root / "models" / "ml" / "1", shards=2, quant="fp32", progress=False)
    return root / "models", table


@pytest.fixture(scope="session")
def requests_(tiny_model):
    """Real requests: rows grouped by request_id -> (request features, candidates' item features)."""
    _, table = tiny_model
    cols = table.to_pydict()
    req_in = ["user_id", "age", "gender", "occupation", "zip_prefix"]
    item_in = ["movie_id", "genres", "title_words", "release_year"]
    groups: dict[str, list[int]] = {}
    for i, rid in enumerate(cols["request_id"]):
        groups.setdefault(rid, []).append(i)
    out = []
    for rows in groups.values():
        if len(rows) >= 3:
            out.append(({c: cols[c][rows[0]] for c in req_in}, [{c: cols[c][i] for c in item_in} for i in rows[:100]]))
        if len(out) == 60:
            break
    return out


class StdinWriter:
    """``python -c code`` driven line by line over stdin (a store writer in another process).

    The script prints "ready" first, answers each command with one line and exits on
    "quit". As a context manager: on a clean exit it sends "quit" and asserts exit code
    0; on an error (or ``kill()``) the process is killed.
    """

    def __init__(self, code: str):
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert self.proc.stdout.readline().strip() == "ready"
        except BaseException:
            self.kill()
            raise

    def send(self, line: str, expect: str | None = None) -> list[str]:
        """Send one command; its answer, split (its first word must be ``expect`` when given)."""
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline().split()
        if expect is not None:
            assert out and out[0] == expect, out
        return out

    def quit(self) -> int:
        """Ask the script to exit; its exit code (killed if it does not exit within 30 s)."""
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            return self.proc.wait(timeout=30)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "StdinWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.kill()
        else:
            assert self.quit() == 0


STORE_WRITER = """
import json, sys, time
import numpy as np
sys.path.insert(0, {root!r})
from offgraph.store import open_store
st = open_store({path!r}, mode="w")
print("ready", flush=True)
for line in sys.stdin:
    cmd, _, arg = line.partition(" ")
    if cmd != "write":
        break
    a = json.loads(arg)
    res = st.write(a["table"], np.array(a["rows"], np.int64), np.array(a["vectors"], np.float32),
                   np.array(a["first_order"], np.float32), seqs=a["seqs"], feed=a["feed"],
                   meta={{k.encode(): v.encode() for k, v in a["meta"].items()}})
    print("written", res.applied, time.time(), flush=True)
st.close()
"""


class StoreWriter(StdinWriter):
    """The store at ``path`` opened for writing (mode "w") in another process: :meth:`write`
    is its ``store.write`` (the one writer the store allows; this test process follows it)."""

    def __init__(self, path):
        super().__init__(STORE_WRITER.format(root=str(REPO), path=str(path)))

    def write(
        self, table, rows, vectors, first_order, *, seqs=None, feed: bool = False, meta: dict[str, str] | None = None
    ) -> tuple[int, float]:
        """``store.write`` in the writer process: (rows applied, the writer's ``time.time()`` after it)."""
        import json

        import numpy as np

        arg = {
            "table": int(table),
            "rows": np.asarray(rows).tolist(),
            "vectors": np.asarray(vectors, np.float32).tolist(),
            "first_order": np.asarray(first_order, np.float32).tolist(),
            "seqs": None if seqs is None else np.asarray(seqs).tolist(),
            "feed": feed,
            "meta": meta or {},
        }
        out = self.send("write " + json.dumps(arg), "written")
        return int(out[1]), float(out[2])


def run_then_kill(code: str, seconds: float = 1.0) -> None:
    """Run ``python -c code`` until it prints "ready", let it work ``seconds``, then SIGKILL it."""
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        threading.Event().wait(seconds)
    finally:
        proc.kill()
        proc.wait()


# The fast / slow test tiers (`make test-fast` = pytest -m "not slow"): tiers.py marks the slow tests.
from tiers import pytest_collection_modifyitems  # noqa: E402,F401


@pytest.fixture(scope="session", autouse=True)
def feed_shm():
    """The write feeds of this session (their epochs are memory: /dev/shm is not cleaned until a
    reboot) in one directory under /dev/shm, removed at the end; subprocesses inherit it."""
    import shutil
    import tempfile

    from offgraph.store.feed import SHM_ENV

    d = tempfile.mkdtemp(prefix="offgraph-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    old = os.environ.get(SHM_ENV)
    os.environ[SHM_ENV] = d
    try:
        yield Path(d)
    finally:
        if old is None:
            os.environ.pop(SHM_ENV, None)
        else:
            os.environ[SHM_ENV] = old
        shutil.rmtree(d, ignore_errors=True)
