"""`offgraph prune`: delete a model's old versions, their rows in a remote store included.

A version is kept when it is among the newest ``--keep``, pinned or labelled by an admin decision
(MODELS/NAME/admin-policy.json). Each version pruned is first renamed ``.pruning-V`` (atomic: a server
stops seeing it at its next scan, only digit names are versions), then its remote rows are deleted
(``RedisBackend.delete_rows``: one shard at a time, UNLINK, so that no master blocks), then its directory.
A prune killed midway leaves a ``.pruning-V`` that the next prune finishes.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger("offgraph.prune")

PRUNING = ".pruning-"


def register_cli(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="delete a model's old versions (a remote store's rows included)")
    p.add_argument("--models", required=True, help="MODELS directory")
    p.add_argument("--model", required=True, help="model name (MODELS/NAME)")
    p.add_argument("--keep", type=int, default=2, help="newest complete versions kept (default %(default)s)")
    p.add_argument("--pause", type=float, default=0.05, help="seconds between the shards a remote delete frees")
    p.add_argument("--dry-run", action="store_true", help="say what would be deleted, delete nothing")
    p.set_defaults(func=run)


def kept_versions(model_dir: Path, keep: int) -> tuple[list[int], list[int]]:
    """(kept, pruned) complete versions of a model: the newest ``keep``, the pinned one and the labelled
    ones are kept."""
    from offgraph.modeldir.manifest import complete_versions
    from offgraph.server.models.control import load_admin_policy

    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ValueError(f"--keep must be an int >= 1, got {keep!r}")
    versions = complete_versions(model_dir)
    _, pinned, labels = load_admin_policy(model_dir)
    kept = set(versions[-keep:]) | set(labels.values()) | ({pinned} if pinned is not None else set())
    return [v for v in versions if v in kept], [v for v in versions if v not in kept]


def delete_version_dir(path: Path, pause_s: float) -> None:
    """Delete one renamed version: its remote rows first (when its store is remote), then the directory."""
    from offgraph.store.open import delete_remote_rows

    if (path / "store" / "store.json").is_file():
        delete_remote_rows(path / "store", pause_s=pause_s)
    shutil.rmtree(path)


def prune(model_dir: Path, keep: int, pause_s: float = 0.05, dry_run: bool = False) -> list[int]:
    """Prune ``model_dir``'s old versions (and finish an interrupted prune); the versions pruned."""
    kept, doomed = kept_versions(model_dir, keep)
    leftovers = sorted(p for p in model_dir.glob(PRUNING + "*") if p.is_dir())
    if dry_run:
        return doomed
    for p in leftovers:
        log.info("%s: finishing the interrupted prune of %s", model_dir, p.name)
        delete_version_dir(p, pause_s)
    for v in doomed:
        tmp = model_dir / f"{PRUNING}{v}"
        os.rename(model_dir / str(v), tmp)
        delete_version_dir(tmp, pause_s)
        log.info("%s: pruned version %d (kept %s)", model_dir, v, kept)
    return doomed


def run(args) -> int:
    model_dir = Path(args.models) / args.model
    if not model_dir.is_dir():
        raise ValueError(f"{model_dir}: no such model directory")
    done = prune(model_dir, args.keep, args.pause, args.dry_run)
    what = "would prune" if args.dry_run else "pruned"
    print(f"offgraph prune: {what} {len(done)} version(s) of {args.model}: {done or 'none'}")
    return 0
