import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def movielens_table(tmp_path_factory):
    """The real MovieLens-100k flat table (built once per test session)."""
    from dense_model.datasets import build
    import pyarrow.parquet as pq

    out = tmp_path_factory.mktemp("ml")
    return pq.read_table(build("movielens-100k", out))


@pytest.fixture(scope="session")
def small_run(movielens_table, tmp_path_factory):
    """A DeepFM trained for 1 epoch on the first 30k MovieLens ratings: (run_dir, table)."""
    from dense_model.train import TrainConfig, train_run
    from features import load_spec

    spec = load_spec(REPO / "examples" / "movielens.yaml")
    table = movielens_table.slice(0, 30000)
    run = tmp_path_factory.mktemp("run") / "run"
    train_run(spec, table, TrainConfig(epochs=1, split="per-key-time"), run, progress=False)
    return run, table


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
