"""`offgraph stream-train`: fresh labelled events -> gradient steps on the rows they touch ->
delta files in a spool (applied to the live store by `offgraph update`). The events: a file (--events), or
the served log joined with an outcome log (--served --outcomes: ``offgraph.streaming.served_events``)."""

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
        help="labelled events: Parquet, CSV/TSV or JSON lines, with the "
        "spec's input and label columns (time order by its time column); or --served and --outcomes",
    )
    p.add_argument(
        "--served",
        metavar="DIR|URL",
        help="instead of --events: the served log, its directory (serve --served-log-dir) or kafka://HOST:PORT/TOPIC "
        "(serve --served-log-kafka), joined with --outcomes: the features the server computed, labelled 1 where clicked",
    )
    p.add_argument(
        "--outcomes",
        metavar="FILE",
        help="with --served: outcome log, Parquet or CSV: request_id, the item field, event (click, play, play_share)",
    )
    p.add_argument("--arm", help="with --served: only the requests served by this experiment arm (default: all)")
    p.add_argument(
        "--item-field", help="with --served: the candidates' item key in both logs (default: the spec's item_key)"
    )
    p.add_argument(
        "--label",
        choices=("click", "gain"),
        help="with --served: each candidate's label, 1 where clicked (click, the default), or its summed "
        "--gain-event values (gain: a graded label, for a model trained with a loss over lists)",
    )
    p.add_argument(
        "--gain-event",
        choices=("click", "play", "play_share"),
        help="with --served --label gain: the outcome event whose values are the gain (default: play_share)",
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


def check_source(args: argparse.Namespace) -> None:
    """Exactly one source of events: --events FILE, or --served DIR|URL with --outcomes FILE (--arm and --item-field
    with --served only); a ValueError (one line, exit 2) naming the flags otherwise."""
    if (args.events is None) == (args.served is None):
        raise ValueError(
            "give one source of events: --events FILE, or --served DIR|URL --outcomes FILE"
            if args.events is None
            else "--events and --served are two sources of events: give one"
        )
    if args.served is not None and args.outcomes is None:
        raise ValueError("--served needs --outcomes FILE: the outcome log that labels the served candidates")
    if args.gain_event is not None and args.label != "gain":
        raise ValueError("--gain-event goes with --label gain")
    if args.served is None:
        extra = [
            flag for flag in ("outcomes", "arm", "item_field", "label", "gain_event") if getattr(args, flag) is not None
        ]
        if extra:
            raise ValueError(f"--{extra[0].replace('_', '-')} goes with --served (the served log)")


def events_source(args: argparse.Namespace) -> str:
    return str(args.events) if args.served is None else f"served log {args.served} joined with {args.outcomes}"


def served_table(args: argparse.Namespace, trainer, cfg: StreamTrainConfig):
    """The events of the served log in --served (a spool directory, or a Kafka topic read from its beginning to
    its end now; the trainer's model's records, --arm's only if given) joined with --outcomes
    (``offgraph.streaming.served_events``), the time in the trainer's --time-unit (auto: ms)."""
    from pathlib import Path

    from offgraph.streaming.served_events import served_events
    from offgraph.streaming.served_outcomes import read_outcomes

    if args.served.startswith("kafka://"):
        from offgraph.server.process.served_log_kafka import read_served_kafka

        served = read_served_kafka(args.served)
    else:
        from offgraph.server.process.served_log_spool import read_served

        if not Path(args.served).is_dir():
            raise ValueError(f"--served {args.served}: no such served-log directory")
        served = read_served(args.served)
    if served.num_rows == 0:
        raise ValueError(f"--served {args.served}: the served log holds no record")
    return served_events(
        served,
        read_outcomes(args.outcomes),
        trainer.spec,
        item_field=args.item_field,
        label=args.label or "click",
        gain_event=args.gain_event or "play_share",
        time_unit=cfg.time_unit,
        model=trainer.model_name,
        arm=args.arm,
    )


def run(args: argparse.Namespace) -> int:
    check_source(args)
    cfg = settings_from_args(StreamTrainConfig, args)
    from offgraph.features.tables import read_table  # TensorFlow: only once the settings are known to be good
    from offgraph.streaming.sinks import open_sink
    from offgraph.streaming.stream_train import open_trainer, stream_train_table

    if not (args.emit.startswith("kafka://") or args.emit.startswith("spool:")):
        raise ValueError(f"--emit {args.emit!r}: expected spool:DIR or kafka://HOST:PORT/TOPIC")
    table = read_table(args.events) if args.events is not None else None
    with open_trainer(
        model_dir=args.model, run_dir=args.run, config=cfg, model_name=args.model_name, model_version=args.model_version
    ) as trainer:
        if table is None:  # the served log: read with the trainer's spec, model and time unit
            table = served_table(args, trainer, cfg)
        with open_sink(args.emit, version_dir=trainer.source.version_dir, partitions=args.partitions) as sink:
            s = stream_train_table(trainer, table, sink, progress=not args.no_progress, source=events_source(args))
    print(
        f"stream-train {s['model']}/{s['model_version']}: {s['events']} events, {s['rows_touched']} rows touched, "
        f"{s['files_emitted']} delta batch(es) -> {args.emit}, {s['seconds']:.1f}s ({s['events_per_second']:,.0f} ev/s); "
        f"progressive AUC {s['progressive_auc']:.4f} logloss {s['progressive_logloss']:.4f}"
        + (f" NDCG@10 {s['progressive_ndcg@10']:.4f}" if "progressive_ndcg@10" in s else "")
    )
    if args.json:
        strict_json.write(args.json, s, indent=2)
    return 0
