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
