"""SynthConfig: the settings of `offgraph synth` (pydantic only: the CLI imports it)."""

from __future__ import annotations

import argparse
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from offgraph.config import ConfigModel, option
from offgraph.modeldir.layout import DEFAULT_HOT_SET_ROWS

BYTES_PER_ROW = {"int8": 28.0, "fp16": 42.0, "fp32": 82.0}
"""Disk bytes a row takes, for the free-space check (offgraph/store/README.md, 8 shards, D=16, rounded up)."""
DISK_MARGIN = 1.10
"""The free space asked for, relative to the estimate."""


def count(text: str) -> int:
    """A row count: ``1000000``, ``1_000_000``, ``1e6`` or ``2e8`` (an exact integer)."""
    t = text.strip().replace("_", "")
    m = re.fullmatch(r"(\d+)(?:[eE](\d+))?", t)
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a row count (e.g. 1000000 or 1e6)")
    return int(m[1]) * 10 ** int(m[2] or 0)


class SynthConfig(ConfigModel, frozen=True):
    """Settings of `offgraph synth`.

    rows: rows of all tables together (``offgraph.export.synth_spec`` splits them).
    seed: seeds the tables and the dense head's weights.
    dim, quant, shards, block_cache_mb: as `offgraph export` (int8, D=16 by default).
    workers: SST writer processes of the bulk load (None: the store's default).
    backend: as `offgraph export --backend`.
    hot_set_data / hot_set_rows: as `offgraph export`'s: a file of training rows in the synthetic spec's raw
        inputs (``bench.hot_set_seed`` writes one), whose most looked-up rows the version records as its
        static hot set (``offgraph.modeldir.hot_set``); every row of the file counts.
    """

    rows: int = option(
        ge=1,
        flag="--rows",
        parse=count,
        description="rows of all tables together, e.g. 1e9 (a few huge id tables take most; ~28 B a row on disk "
        "in int8)",
    )
    seed: int = option(0, ge=0, lt=2**63, flag="--seed", description="seeds the tables and the dense head")
    dim: int = option(16, ge=1, le=1024, flag="--dim", description="embedding dim")
    quant: Literal["int8", "fp16", "fp32"] = option("int8", flag="--quant", description="row format")
    shards: int = option(8, ge=1, le=256, flag="--shards", description="store shards")
    block_cache_mb: int = Field(64, ge=1)
    workers: int | None = option(None, ge=1, flag="--workers", shown="the store's", description="SST writer processes")
    backend: str = option(
        "rocksdb",
        flag="--backend",
        description="where the rows live: rocksdb (the version directory) or redis://HOST:PORT (a Redis Cluster)",
    )

    hot_set_data: str | None = option(
        None,
        flag="--hot-set-data",
        shown="none",
        description="training rows in the synthetic spec's raw inputs (Parquet, CSV, JSON lines): record the rows "
        "they look up most as the version's static hot set",
    )
    hot_set_rows: int = option(
        DEFAULT_HOT_SET_ROWS, ge=0, flag="--hot-set-rows", description="rows of the hot set (0: none)"
    )

    @field_validator("backend")
    @classmethod
    def _backend(cls, v: str) -> str:
        from offgraph.store.open import backend_location

        backend_location(v)  # ValueError naming the forms
        return v

    @model_validator(mode="after")
    def _enough_rows(self) -> SynthConfig:
        from offgraph.export.synth_spec import huge_table_rows

        huge_table_rows(self.rows)  # ValueError naming the minimum
        return self

    def disk_bytes(self) -> int:
        """Estimated bytes on disk of the version (the store; the dense head is ~1 MB; a remote backend's
        rows take none)."""
        if self.backend != "rocksdb":
            return 1 << 20
        return int(self.rows * BYTES_PER_ROW[self.quant] * (self.dim + 5) / 21) + (1 << 20)
