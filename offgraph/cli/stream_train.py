"""`offgraph stream-train`: fresh labelled events -> gradient steps on the rows they touch ->
delta files in a spool (applied to the live store by `offgraph update`)."""

from __future__ import annotations

import argparse

# TensorFlow-free: `offgraph --help` imports this module. The settings' flags, defaults and checks (a clear
# error, exit 2) come from StreamTrainConfig, whose module imports pydantic only.
from offgraph.cli.settings_flags import add_settings_flags, settings_from_args
from offgraph.streaming import strict_json
from offgraph.streaming.stream_train_config import StreamTrainConfig


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stream-train", help="incremental trainer: labelled events -> row deltas into a spool")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--model",
        help="exported MODELS/NAME/VERSION (or MODELS/NAME: newest complete version); "
        "rows from its store, gradient through its dense SavedModel",
    )
    src.add_argument(
        "--run", help="training run directory (Keras tables and head); needs --model-name and --model-version"
    )
    p.add_argument(
        "--events",
        required=True,
        help="labelled events: Parquet, CSV/TSV or JSON lines, with the "
        "spec's input and label columns (time order by its time column)",
    )
    p.add_argument("--emit", required=True, help="delta sink: spool:DIR or kafka://HOST:PORT/TOPIC")
    p.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="kafka: partitions of the topic if it has to be created (default %(default)s)",
    )
    p.add_argument("--model-name", help="model name in the deltas (default: the model directory's name)")
    p.add_argument("--model-version", type=int, help="model version in the deltas (default: the version dir)")
    add_settings_flags(p, StreamTrainConfig, exclude={"adagrad_eps"})
    p.add_argument(
        "--json",
        help="also write the summary to this file (strict JSON: an undefined metric, e.g. "
        "the AUC of events of one class, is null; default: none)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = settings_from_args(StreamTrainConfig, args)
    from offgraph.features.tables import read_table  # TensorFlow: only once the settings are known to be good
    from offgraph.streaming.sinks import open_sink
    from offgraph.streaming.stream_train import open_trainer, stream_train_table

    if not (args.emit.startswith("kafka://") or args.emit.startswith("spool:")):
        raise ValueError(f"--emit {args.emit!r}: expected spool:DIR or kafka://HOST:PORT/TOPIC")
    table = read_table(args.events)
    with open_trainer(
        model_dir=args.model, run_dir=args.run, config=cfg, model_name=args.model_name, model_version=args.model_version
    ) as trainer:
        with open_sink(args.emit, version_dir=trainer.source.version_dir, partitions=args.partitions) as sink:
            s = stream_train_table(trainer, table, sink, progress=not args.no_progress, source=str(args.events))
    print(
        f"stream-train {s['model']}/{s['model_version']}: {s['events']} events, {s['rows_touched']} rows touched, "
        f"{s['files_emitted']} delta batch(es) -> {args.emit}, {s['seconds']:.1f}s ({s['events_per_second']:,.0f} ev/s); "
        f"progressive AUC {s['progressive_auc']:.4f} logloss {s['progressive_logloss']:.4f}"
    )
    if args.json:
        strict_json.write(args.json, s, indent=2)
    return 0
