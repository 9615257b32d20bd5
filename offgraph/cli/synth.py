"""`offgraph synth`: write a synthetic, servable model version of any size (sizing hardware, benches)."""

from __future__ import annotations

import argparse

# `offgraph --help` imports this module: nothing heavy here (offgraph.export.synth is imported in run)
from offgraph.cli.export import write_to
from offgraph.cli.settings_flags import add_settings_flags, settings_from_args
from offgraph.export.synth_config import SynthConfig, count  # noqa: F401 (count: the row-count parser, here too)
from offgraph.objectstore.base import check_scheme


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write a synthetic model version of any size (random seeded tables and "
        "dense head), servable by `offgraph serve`",
    )
    p.add_argument(
        "--out", required=True, help="version directory MODELS/NAME/VERSION, or s3://BUCKET/PREFIX/NAME/VERSION"
    )
    add_settings_flags(p, SynthConfig, exclude={"block_cache_mb"})
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    check_scheme(args.out)  # before anything is written: an s3:// path is never a local folder
    config = settings_from_args(SynthConfig, args)
    from offgraph.export.synth import synth_version

    print(
        f"offgraph synth: {config.rows:,} rows, {config.quant}, D={config.dim}: about "
        f"{config.disk_bytes() / 1e9:.2f} GB on disk",
        flush=True,
    )
    m, uploaded = write_to(args.out, lambda out: synth_version(out, config, progress=not args.no_progress))
    assert m.export_seconds is not None and m.store.bytes_on_disk is not None  # a fresh export records both
    secs, disk = m.export_seconds.store, m.store.bytes_on_disk
    where = (
        f"{disk / 2**20:.1f} MiB on disk ({disk / config.rows:.1f} B/row)"
        if config.backend == "rocksdb"
        else f"in {config.backend} (namespace {m.store.to_dict().get('namespace')})"
    )
    print(
        f"synth -> {args.out}: {len(m.fields)} tables, {config.rows:,} rows, {where}, "
        f"store {secs:.1f}s ({config.rows / max(secs, 1e-9):,.0f} rows/s)" + uploaded
    )
    return 0
