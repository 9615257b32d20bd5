"""`offgraph plan`: the expected hit ratio and read time per request of a synth-shaped version
(``offgraph.export.plan`` holds the model)."""

from __future__ import annotations

import argparse
import json
import math

from offgraph.export.plan import DEFAULT_MAX_SECONDS, MAX_REQUESTS, Device, describe, predict
from offgraph.export.synth_config import count


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
        return v

    return parse


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="predict the hit ratio and the read time per request of a synth-shaped "
        "version from the disk's latency and the memory budget (sizing hardware)",
    )
    p.add_argument("--rows", type=count, required=True, help="rows of all tables together, e.g. 1e9")
    p.add_argument(
        "--memory-mb",
        type=_positive(float),
        default=None,
        help="the worker's cache budget, as `offgraph serve --memory-mb` (default: serve's default)",
    )
    traffic = p.add_mutually_exclusive_group()
    traffic.add_argument(
        "--zipf",
        type=_positive(float),
        default=None,
        metavar="S",
        help="Zipf exponent of the traffic (> 1; default the bench's, 1.1)",
    )
    traffic.add_argument("--uniform", action="store_true", help="uniform traffic (every row about equally likely)")
    p.add_argument("--candidates", type=_positive(int), default=200, help="candidates per request (default 200)")
    p.add_argument(
        "--read-threads",
        type=_positive(int),
        default=None,
        help="store read threads (default: the store's, offgraph.store.config.DEFAULT_READ_THREADS)",
    )
    p.add_argument(
        "--probe",
        metavar="DIR",
        default=None,
        help="measure the device: direct reads of the .sst files of the version or store at DIR",
    )
    p.add_argument("--probe-s", type=_positive(float), default=2.0, help="seconds of probe per depth (default 2)")
    p.add_argument("--disk-ms-qd1", type=_positive(float), default=None, help="the device's mean read ms at depth 1")
    p.add_argument("--disk-ms-qd8", type=_positive(float), default=None, help="the device's mean read ms at depth 8")
    p.add_argument(
        "--disk-iops-qd8", type=_positive(float), default=None, help="the device's reads per second at depth 8"
    )
    p.add_argument(
        "--max-seconds",
        type=_positive(float),
        default=DEFAULT_MAX_SECONDS,
        help="time limit of the hit-ratio simulation (default %(default)g)",
    )
    p.add_argument(
        "--max-requests",
        type=_positive(int),
        default=MAX_REQUESTS,
        help="most requests the hit-ratio simulation replays (default %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def _device(args) -> Device:
    given = {
        "--disk-ms-qd1": args.disk_ms_qd1,
        "--disk-ms-qd8": args.disk_ms_qd8,
        "--disk-iops-qd8": args.disk_iops_qd8,
    }
    if args.probe is not None:
        if any(v is not None for v in given.values()):
            raise ValueError(
                "--probe measures the device: give it or --disk-ms-qd1/--disk-ms-qd8/--disk-iops-qd8, not both"
            )
        from pathlib import Path

        from offgraph.store.device_probe import device_profile
        from offgraph.store.prefetch import store_files

        d = Path(args.probe)
        if not d.is_dir():
            raise ValueError(f"--probe {args.probe}: not a directory")
        files = store_files(d) or store_files(d / "store")
        if not files:
            raise ValueError(f"--probe {args.probe}: no store files (shard-*/*.sst) in it or in its store/")
        return Device.from_profile(device_profile(files, args.probe_s), source=f"probe of {d}")
    missing = [k for k, v in given.items() if v is None]
    if len(missing) == 3:
        raise ValueError("give --probe DIR or --disk-ms-qd1, --disk-ms-qd8 and --disk-iops-qd8")
    if missing:
        raise ValueError(
            f"{', '.join(missing)} missing: the device needs all of --disk-ms-qd1, --disk-ms-qd8, --disk-iops-qd8"
        )
    return Device(args.disk_ms_qd1, args.disk_ms_qd8, args.disk_iops_qd8)


def run(args) -> int:
    from offgraph.scoring.memory_budget import DEFAULT_MEMORY_MB

    if args.zipf is not None and not args.zipf > 1:
        raise ValueError(f"--zipf must be > 1, got {args.zipf:g}")
    device = _device(args)
    plan = predict(
        args.rows,
        args.memory_mb or DEFAULT_MEMORY_MB,
        "uniform" if args.uniform else "zipf",
        args.zipf,
        args.candidates,
        device,
        args.read_threads,
        args.max_seconds,
        args.max_requests,
    )
    print(json.dumps(plan, allow_nan=False, indent=1) if args.json else describe(plan))
    return 0
