"""`offgraph synth`: write a synthetic, servable model version of any size (sizing hardware, benches)."""

from __future__ import annotations

import argparse

# `offgraph --help` imports this module: nothing heavy here (offgraph.export.synth is imported in run)
from offgraph.config import default
from offgraph.export.synth_config import SynthConfig, count


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="write a synthetic model version of any size (random seeded tables and "
        "dense head), servable by `offgraph serve`",
    )
    p.add_argument("--out", required=True, help="version directory MODELS/NAME/VERSION")
    p.add_argument(
        "--rows",
        type=count,
        required=True,
        help="rows of all tables together, e.g. 1e9 (a few huge id tables take most; ~28 B a row on disk in int8)",
    )
    p.add_argument("--seed", type=int, default=default(SynthConfig, "seed"))
    p.add_argument("--dim", type=int, default=default(SynthConfig, "dim"), help="embedding dim (default %(default)s)")
    p.add_argument("--quant", default=default(SynthConfig, "quant"), help="int8, fp16 or fp32 (default %(default)s)")
    p.add_argument("--shards", type=int, default=default(SynthConfig, "shards"))
    p.add_argument("--workers", type=int, default=None, help="SST writer processes (default: the store's)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    config = SynthConfig(
        rows=args.rows, seed=args.seed, dim=args.dim, quant=args.quant, shards=args.shards, workers=args.workers
    )
    from offgraph.export.synth import synth_version

    print(
        f"offgraph synth: {config.rows:,} rows, {config.quant}, D={config.dim}: about "
        f"{config.disk_bytes() / 1e9:.2f} GB on disk",
        flush=True,
    )
    m = synth_version(args.out, config, progress=not args.no_progress)
    secs, disk = m["export_seconds"]["store"], m["store"]["bytes_on_disk"]
    print(
        f"synth -> {args.out}: {len(m['fields'])} tables, {config.rows:,} rows, {disk / 2**20:.1f} MiB on disk "
        f"({disk / config.rows:.1f} B/row), store {secs:.1f}s ({config.rows / max(secs, 1e-9):,.0f} rows/s)"
    )
    return 0
