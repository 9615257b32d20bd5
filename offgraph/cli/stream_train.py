"""`offgraph stream-train`: fresh labelled events -> gradient steps on the rows they touch ->
delta files in a spool (applied to the live store by `offgraph update`)."""

from __future__ import annotations

import argparse

# TensorFlow-free: `offgraph --help` imports this module. Defaults and checks (a clear error, exit 2) come
# from StreamTrainConfig, whose module imports pydantic only.
from offgraph.config import default
from offgraph.streaming import strict_json
from offgraph.streaming.stream_train_config import OPTIMIZERS, TIME_UNITS, StreamTrainConfig


def _default(name: str):
    return default(StreamTrainConfig, name)


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
    p.add_argument(
        "--lr",
        type=float,
        default=_default("lr"),
        help="embedding step size (default %(default)g; the loss is summed over a batch: keep lr x batch small)",
    )
    p.add_argument(
        "--optimizer",
        default=_default("optimizer"),
        help=f"one of {', '.join(OPTIMIZERS)} (default %(default)s; adagrad is row-wise)",
    )
    p.add_argument(
        "--batch-size", type=int, default=_default("batch_size"), help="events per step (default %(default)s)"
    )
    p.add_argument(
        "--lr-first-order",
        type=float,
        default=_default("lr_first_order"),
        help="learning rate of the first-order weights (default: --lr)",
    )
    p.add_argument(
        "--fields",
        default=None,
        help="comma-separated fields whose rows are trained (default: all); e.g. user_id,movie_id: "
        "shared side-feature tables stay frozen",
    )
    p.add_argument(
        "--l2",
        type=float,
        default=_default("l2"),
        help="L2 on the touched rows (l2/2 |row|^2 per batch; default %(default)g)",
    )
    p.add_argument(
        "--adagrad-init",
        type=float,
        default=_default("adagrad_init"),
        help="initial row-wise Adagrad accumulator (default %(default)g)",
    )
    p.add_argument(
        "--every-events", type=int, default=_default("every_events"), help="emit one delta file every K events"
    )
    p.add_argument(
        "--every-seconds", type=float, default=_default("every_seconds"), help="... or every T seconds (and at the end)"
    )
    p.add_argument("--model-name", help="model name in the deltas (default: the model directory's name)")
    p.add_argument("--model-version", type=int, help="model version in the deltas (default: the version dir)")
    p.add_argument(
        "--seq-start", type=int, default=_default("seq_start"), help="first sequence number (default: time_ns now)"
    )
    p.add_argument(
        "--time-unit",
        default=_default("time_unit"),
        help=f"unit of the spec's time column: auto, {', '.join(TIME_UNITS)} (default %(default)s)",
    )
    p.add_argument(
        "--json",
        help="also write the summary to this file (strict JSON: an undefined metric, e.g. "
        "the AUC of events of one class, is null)",
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    fields = None if args.fields is None else tuple(f.strip() for f in args.fields.split(",") if f.strip())
    cfg = StreamTrainConfig(
        lr=args.lr,
        optimizer=args.optimizer,
        batch_size=args.batch_size,
        l2=args.l2,
        lr_first_order=args.lr_first_order,
        fields=fields,
        adagrad_init=args.adagrad_init,
        every_events=args.every_events,
        every_seconds=args.every_seconds,
        seq_start=args.seq_start,
        time_unit=args.time_unit,
    )
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
