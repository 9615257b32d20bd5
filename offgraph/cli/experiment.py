"""`offgraph experiment set|show|clear`: a running server's experiment for one model, through its admin API
(``PUT``/``GET``/``DELETE /v1/models/{name}/experiment``, the admin bearer token). The rule of the split:
``offgraph.server.models.experiment``. `offgraph experiment report`: the served log joined with an outcome log,
per arm (``offgraph.experiments.report``), printed, and as JSON and a PNG."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

TOKEN_ENV = "OFFGRAPH_ADMIN_TOKEN"  # offgraph.server.config.ADMIN_TOKEN_ENV (not imported: it loads pydantic)
ARM_HELP = "an arm and its weight: version=N:W, label=NAME:W or prior:W (e.g. version=3:0.8); the first is the control"


def parse_arm(text: str) -> dict:
    """``version=3:0.8`` -> ``{"version": 3, "weight": 0.8}``; ``label=canary:0.1``; ``prior:0.1``."""
    what, sep, weight = text.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"{text!r}: {ARM_HELP}")
    try:
        w = float(weight)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the weight {weight!r} is not a number") from None
    if what == "prior":
        return {"prior": True, "weight": w}
    kind, eq, ref = what.partition("=")
    if kind == "version" and eq and ref.isdigit():
        return {"version": int(ref), "weight": w}
    if kind == "label" and eq and ref:
        return {"label": ref, "weight": w}
    raise argparse.ArgumentTypeError(f"{text!r}: {ARM_HELP}")


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="set, show or clear a running server's experiment for a model")
    actions = p.add_subparsers(dest="action", required=True)
    for name, doc in (
        ("set", "split the model's requests over arms by a sticky request key"),
        ("show", "print the model's experiment (its arms, weights and ranges)"),
        ("clear", "end the model's experiment"),
    ):
        a = actions.add_parser(name, help=doc)
        a.add_argument("--url", default="http://127.0.0.1:8500", help="the server's base URL (default %(default)s)")
        a.add_argument("--model", required=True, help="model name")
        a.add_argument("--admin-token", default=None, help=f"the server's admin token (default: ${TOKEN_ENV})")
        a.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the answer")
        if name == "set":
            a.add_argument("--arm", dest="arms", action="append", type=parse_arm, required=True, help=ARM_HELP)
            a.add_argument("--sticky-key", required=True, help="the request feature that fixes a user's arm")
            a.add_argument(
                "--salt", default=None, help="hashed with the key (default: the current experiment's, or a new one)"
            )
        a.set_defaults(func=run)
    register_report(actions)


def register_report(actions: argparse._SubParsersAction) -> None:
    r = actions.add_parser(
        "report",
        help="per arm: requests, users, CTR, UCTR, mean gain and NDCG@k of the served order from a served log and "
        "an outcome log, with 95%% cluster-bootstrap intervals and each arm's difference from the control",
    )
    r.add_argument("--served", required=True, help="the served log's directory (serve --served-log-dir)")
    r.add_argument(
        "--outcomes",
        required=True,
        help="outcome log, Parquet or CSV: request_id, the item field, event (click, play, play_share), "
        "value (optional; play_share's share)",
    )
    r.add_argument("--control", default=None, help="the arm the others are compared with (default: most requests)")
    r.add_argument("--json", default=None, metavar="OUT", help="write every figure as JSON here")
    r.add_argument("--png", default=None, metavar="OUT", help="plot the figures with their intervals here")
    r.add_argument("--k", type=int, default=10, help="NDCG's cut-off")
    r.add_argument(
        "--item-field",
        default=None,
        help="the candidates' item key in both logs (default: the model spec's item_key, from --models)",
    )
    r.add_argument("--models", default=None, help="the models directory: the spec's item_key when no --item-field")
    r.add_argument("--user-field", default="user_id", help="the request's user key (the experiment's sticky key)")
    r.add_argument(
        "--gain-event",
        default="play_share",
        choices=("click", "play", "play_share"),
        help="the outcome event whose values are a candidate's gain (mean gain, NDCG)",
    )
    r.add_argument("--model", default=None, help="the model to report (needed when the log holds several)")
    r.add_argument("--draws", type=int, default=1000, help="bootstrap resamples of the users")
    r.add_argument("--seed", type=int, default=0, help="seeds the resamples")
    r.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from offgraph.experiments.report import (
        ReportError,
        experiment_report,
        format_report,
        item_field_from_models,
        plot_report,
        read_outcomes,
        report_json,
    )
    from offgraph.server.process.served_log_spool import read_served

    if not Path(args.served).is_dir():
        raise ReportError(f"{args.served}: no such served-log directory")
    served = read_served(args.served)
    outcomes = read_outcomes(args.outcomes)
    item_field = args.item_field
    if item_field is None:
        if args.models is None:
            raise ReportError("which field is the item: --item-field, or --models to read the model spec's item_key")
        item_field = item_field_from_models(args.models, served, args.model)
    report = experiment_report(
        served,
        outcomes,
        item_field=item_field,
        user_field=args.user_field,
        control=args.control,
        k=args.k,
        gain_event=args.gain_event,
        model=args.model,
        draws=args.draws,
        seed=args.seed,
    )
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(report_json(report) + "\n")
    if args.png:
        plot_report(report, args.png)
    return 0


def run(args: argparse.Namespace) -> int:
    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # quiet: the answer is the output, not a line per request

    token = args.admin_token or os.environ.get(TOKEN_ENV)
    if not token:
        raise ValueError(f"an admin token is needed: --admin-token or ${TOKEN_ENV}")
    url = f"{args.url.rstrip('/')}/v1/models/{args.model}/experiment"
    headers = {"Authorization": f"Bearer {token}"}
    if args.action == "set":
        body = {"arms": args.arms, "sticky_key": args.sticky_key}
        if args.salt is not None:
            body["salt"] = args.salt
        r = httpx.put(url, json=body, headers=headers, timeout=args.timeout)
    elif args.action == "show":
        r = httpx.get(url, headers=headers, timeout=args.timeout)
    else:
        r = httpx.delete(url, headers=headers, timeout=args.timeout)
    if r.is_success:
        print(json.dumps(r.json(), indent=2))
        return 0
    try:
        detail = r.json().get("detail", r.text)
    except ValueError:
        detail = r.text
    print(f"offgraph experiment {args.action}: error: {r.status_code}: {detail}", file=sys.stderr)
    return 2
