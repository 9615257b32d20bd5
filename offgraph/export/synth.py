"""`offgraph synth`: a complete, servable model version of any size, with random seeded weights.

It goes through the exporter's own path (``offgraph.export.export.write_version``): tables bulk-loaded as
SST files and ingested, the dense head saved as the SavedModel, checksums, the manifest last. The
tables are generated chunk by chunk (``CHUNK_ROWS`` rows, one chunk in memory at a time), each
chunk from its own seed ``(seed, table id, chunk index)``: the same seed gives the same rows, on
any machine and whatever the progress of other tables. The dense head is the project's
``DeepFMHead`` with Keras' seeded initial weights. The spec: ``offgraph.export.synth_spec``.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import numpy as np

from offgraph.export.synth_config import DISK_MARGIN, SynthConfig
from offgraph.modeldir.manifest_model import Manifest

log = logging.getLogger("offgraph.synth")

CHUNK_ROWS = 1 << 18
"""Rows per generated chunk; part of what a seed means (changing it changes the rows)."""
VALUE_SCALE = 0.05
"""Standard deviation of the random embedding values and first-order weights (trained tables are
of this order; CTRs then stay away from 0 and 1)."""


def table_chunks(seed: int, table_id: int, rows: int, dim: int):
    """Chunks ``(rows int64 [k], vectors float32 [k, D], first_order float32 [k])`` of one table,
    ascending, each drawn from its own seed (vectorized: one draw per chunk)."""
    for i, start in enumerate(range(0, rows, CHUNK_ROWS)):
        k = min(CHUNK_ROWS, rows - start)
        rng = np.random.default_rng([seed, table_id, i])
        x = rng.standard_normal((k, dim + 1), dtype=np.float32)
        x *= np.float32(VALUE_SCALE)
        yield np.arange(start, start + k, dtype=np.int64), x[:, :dim], x[:, dim]


def check_disk(out: Path, config: SynthConfig) -> None:
    """Refuse to start when the filesystem of ``out`` lacks the space the version needs."""
    need = config.disk_bytes() * DISK_MARGIN
    probe = out
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise ValueError(
            f"{out}: a {config.rows:,}-row {config.quant} version needs about {need / 1e9:.1f} GB, "
            f"{free / 1e9:.1f} GB are free on that filesystem"
        )


def build_head(num_fields: int, dim: int, mlp: tuple[int, ...], seed: int):
    """The project's DeepFM head with seeded random weights (Keras' initializers)."""
    import keras

    from offgraph.model.head import DeepFMHead

    keras.utils.set_random_seed(seed)
    head = DeepFMHead(num_fields, dim, tuple(mlp), name="head")
    head.build()
    return head


def synth_version(out: str | Path, config: SynthConfig, progress: bool = True) -> Manifest:
    """Write the synthetic version ``out`` (MODELS/NAME/VERSION); returns its manifest."""
    from offgraph.modeldir.manifest import check_version_dir

    out = Path(out)
    check_version_dir(out)  # before TensorFlow is imported: a bad --out is refused at once
    check_disk(out, config)
    from offgraph.export.export import prepare_version_dir, version_store_config, write_version
    from offgraph.export.synth_spec import synth_spec
    from offgraph.features.spec import parse_spec

    spec = parse_spec(synth_spec(config.rows, config.dim), source="offgraph synth")
    head = build_head(len(spec.fields), config.dim, spec.model.mlp, config.seed)
    store_config = version_store_config(
        out,
        config.backend,
        dim=config.dim,
        quant=config.quant,
        shards=config.shards,
        block_cache_mb=config.block_cache_mb,
    )
    hot_set = None
    if config.hot_set_data and config.hot_set_rows > 0:  # before anything is written: bad data fails first
        from offgraph.export.hot_set import hot_set_of
        from offgraph.features.tables import read_table

        data = read_table(config.hot_set_data)
        hot_set = hot_set_of(spec, data, config.hot_set_rows, source=config.hot_set_data, progress=progress)
    prepare_version_dir(out)
    tables = [table_chunks(config.seed, i, f.rows, config.dim) for i, f in enumerate(spec.fields)]
    t0 = time.perf_counter()
    manifest = write_version(
        out,
        spec,
        head,
        tables,
        config=store_config,
        training={"synthetic": config.model_dump()},
        progress=progress,
        workers=config.workers,
        hot_set=hot_set,
    )
    log.debug("synth %s: %d rows in %.1fs", out, config.rows, time.perf_counter() - t0)
    return manifest
