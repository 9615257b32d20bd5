"""Where the named datasets' raw files are looked for: ``--source DIR`` (that dataset's files), else
``$OFFGRAPH_DATA_DIR/NAME``, else ``<repo>/../shared/data/NAME``."""

from __future__ import annotations

import os
from pathlib import Path

DATA_DIR_ENV = "OFFGRAPH_DATA_DIR"
"""A folder holding one folder per dataset (``criteo-10k/``, ``frappe-86k/``, ``movielens-100k/``)."""


def data_root() -> tuple[Path, str]:
    """(the folder of the datasets' folders, where it comes from: the environment or the default)."""
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        return Path(env), f"${DATA_DIR_ENV}"
    return Path(__file__).resolve().parents[2].parent / "shared" / "data", "the default <repo>/../shared/data"


def dataset_dir(name: str, source: str | os.PathLike | None) -> tuple[Path, str]:
    """(the folder to read dataset ``name`` from, where it comes from)."""
    if source is not None:
        return Path(source), "--source"
    root, why = data_root()
    return root / name, why


def where_to_put(name: str, files: str) -> str:
    """The hint of a not-found error: the two ways to say where the files are."""
    return f"pass --source DIR with {files} in it, or set {DATA_DIR_ENV} to a folder holding {name}/"
