"""`offgraph export` and `offgraph check`."""

from __future__ import annotations

import argparse
import json
import sys

from offgraph.cli import LazyChoices

# `offgraph --help` imports this module: nothing heavy here (the exporter is imported in run_export)
from offgraph.cli.table_args import add_table_args, read_table_args
from offgraph.modeldir.layout import DEFAULT_HOT_SET_ROWS
from offgraph.objectstore.base import check_scheme, scheme_of


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="split a trained run into a store + dense SavedModel version")
    p.add_argument("--run", required=True, help="run directory written by `offgraph train`")
    p.add_argument(
        "--out", required=True, help="version directory MODELS/NAME/VERSION, or s3://BUCKET/PREFIX/NAME/VERSION"
    )
    p.add_argument("--shards", type=int, default=8)
    p.add_argument(
        "--backend",
        default="rocksdb",
        help="where the rows live: rocksdb (files in the version directory; default) or redis://HOST:PORT "
        "(a Redis Cluster shared by every server; give it at least 2 shards per master)",
    )
    p.add_argument(
        "--quant",
        choices=LazyChoices("offgraph.store.quant", "CODECS"),
        metavar="QUANT",
        default="int8",
        help="row format: %(choices)s (default %(default)s)",
    )
    p.add_argument(
        "--feature-data",
        help="build the spec's feature tables (MODELS/NAME/features/, shared by the "
        "versions) from this file: the latest value per key of its training rows (see --feature-rows)",
    )
    p.add_argument(
        "--feature-rows",
        choices=["training", "all"],
        default="training",
        help="rows of --feature-data the tables are built from: the run's training rows (the values "
        "known before the held-out cut; default) or all",
    )
    p.add_argument(
        "--hot-set-data",
        help="the run's training file: record in the version the rows its training rows look up most "
        "(the static hot set a server seeds its row cache with when it starts; default: --feature-data's file)",
    )
    p.add_argument(
        "--hot-set-rows",
        type=int,
        default=DEFAULT_HOT_SET_ROWS,
        help="rows of the hot set (default %(default)s; 0: none)",
    )
    add_table_args(p)
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_export)

    c = sub.add_parser("check", help="skew check: trained Keras model vs the out-of-graph scorer")
    c.add_argument("--model", required=True, help="MODELS/NAME/VERSION (or MODELS/NAME: newest version)")
    c.add_argument(
        "--run",
        help="the run the version was exported from (default: none, for a version made by `offgraph import`: "
        "its scores are compared with the import's sources, every row of --data)",
    )
    c.add_argument("--data", required=True)
    add_table_args(c)
    c.add_argument("--limit", type=int, default=10000, help="rows to score (0: all)")
    c.add_argument(
        "--rows",
        choices=["held-out", "all"],
        default=None,
        help="rows to check (default: held-out when --data is the run's training file, else all)",
    )
    c.add_argument(
        "--max-diff",
        type=float,
        default=None,
        help="fail above this max |dp| (default: derived from the model's quantization: 1e-5 plus the "
        "largest |dp| the codec alone makes on these rows; 1e-5 for fp32)",
    )
    c.add_argument(
        "--ids-only",
        action="store_true",
        help="also score every request in its ids-only form (the feature tables fill the rest) and "
        "compare with the full-feature form: any difference fails the check",
    )
    c.add_argument("--json", help="also write the figures to this file")
    c.set_defaults(func=run_check_cli)


def run_export(args) -> int:
    check_scheme(args.out)  # before anything is written: an s3:// path is never a local folder
    from offgraph.export.export import export_run
    from offgraph.modeldir.manifest_model import Manifest

    feature_data = hot_set_data = None
    if args.hot_set_rows < 0:
        print(f"offgraph export: error: --hot-set-rows must be >= 0, got {args.hot_set_rows}", file=sys.stderr)
        return 2
    if args.feature_data:
        args.data = args.feature_data
        feature_data = hot_set_data = read_table_args(args)
    hot_source = args.hot_set_data or args.feature_data
    if args.hot_set_data and args.hot_set_data != args.feature_data:
        args.data = args.hot_set_data
        hot_set_data = read_table_args(args)

    def write(out) -> Manifest:
        return export_run(
            args.run,
            out,
            shards=args.shards,
            quant=args.quant,
            progress=not args.no_progress,
            feature_data=feature_data,
            feature_source=args.feature_data or "<data>",
            feature_rows=args.feature_rows,
            backend=args.backend,
            hot_set_data=hot_set_data,
            hot_set_source=hot_source or "<data>",
            hot_set_rows=args.hot_set_rows,
        )

    m, uploaded = write_to(args.out, write)
    assert m.export_seconds is not None and m.store.bytes_on_disk is not None  # a fresh export records both
    rows, secs = m.store.total_rows, m.export_seconds.store
    print(
        f"exported {args.run} -> {args.out}: {len(m.fields)} tables, {rows:,} rows, {m.store.quant} "
        f"x {m.store.shards} shards, {_where(m)}, "
        f"store {secs:.1f}s ({rows / max(secs, 1e-9):,.0f} rows/s)"
        + (f"; hot set {m.hot_set.rows:,} rows of {m.hot_set.source}" if m.hot_set else "")
        + uploaded
    )
    return 0


def write_to(out: str, write):
    """``write(path)`` for a local ``out``; for a URI, write in a staging folder and upload
    (``offgraph.export.publish``). Returns the manifest and a note on the upload for the summary line."""
    if scheme_of(out) is None:
        return write(out), ""
    from offgraph.export.publish import publish

    m, stats = publish(out, write)
    return m, (
        f"; uploaded {stats.uploaded_objects} files ({stats.uploaded_bytes / 2**20:.1f} MiB)"
        + (f", {stats.skipped_objects} already there" if stats.skipped_objects else "")
    )


def _where(m) -> str:
    """Where a version's rows are, for the export's summary line."""
    rec = m.store.to_dict()
    if rec.get("backend", "rocksdb") != "rocksdb":
        return f"in {rec['backend']} at {rec.get('url')} (namespace {rec.get('namespace')})"
    return f"{(m.store.bytes_on_disk or 0) / 2**20:.1f} MiB on disk"


def run_check_cli(args) -> int:
    from offgraph.export.check import run_check

    if args.max_diff is not None and not args.max_diff >= 0:
        print(f"offgraph check: error: --max-diff must be a number >= 0, got {args.max_diff}", file=sys.stderr)
        return 2
    reference = None
    if args.run is None:
        from offgraph.export.import_model import imported_reference
        from offgraph.scoring.scorer import resolve_version

        reference = imported_reference(resolve_version(args.model))
    res = run_check(
        args.model,
        args.run,
        read_table_args(args),
        args.limit,
        args.rows,
        source=args.data,
        data_path=args.data,
        ids_only=args.ids_only,
        reference=reference,
    )
    max_diff = args.max_diff if args.max_diff is not None else res["derived_max_diff"]
    how = (
        "--max-diff"
        if args.max_diff is not None
        else (f"derived from {res['quant']}: 1e-5 + the codec's own max |dp| {res['quant_max_abs_dp']:.3g}")
    )
    print(
        f"check {res['version']} ({res['quant']}): {res['rows']} {res['row_set']} rows in {res['requests']} requests: "
        f"max |dp| {res['max_abs_dp']:.3g}, mean |dp| {res['mean_abs_dp']:.3g}; "
        f"AUC keras {res['auc_keras']:.5f} served {res['auc_served']:.5f} (delta {res['auc_delta']:+.5f})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    if args.ids_only:
        print(
            f"ids-only vs full features: max |dp| {res['ids_only_max_abs_dp']:.3g} "
            f"({res['ids_only_unknown_candidates']} candidates with an unknown item key, "
            f"{res['ids_only_unknown_requests']} requests with an unknown request key); ids-only vs keras: max |dp| "
            f"{res['ids_only_vs_keras_max_abs_dp']:.3g}"
        )
        if res["ids_only_max_abs_dp"] > 0:
            print(
                "FAIL: ids-only requests score differently from the same requests with every feature sent "
                "(a key the tables lack, or a stored value that differs from the data's)"
            )
            return 1
    if res["max_abs_dp"] > max_diff:
        print(f"FAIL: max |dp| {res['max_abs_dp']:.3g} > {max_diff:.3g} ({how})")
        return 1
    print(f"OK: max |dp| <= {max_diff:.3g} ({how})")
    return 0
