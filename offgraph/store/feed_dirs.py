"""Where a store's write feed lives: memory-backed files, found through a pointer in the store.

Epoch files are memory (a tmpfs): ``$OFFGRAPH_FEED_SHM`` (default ``/dev/shm``)
``/offgraph-feed-<random id>/``. The store directory holds only ``feed.json``: that id and
the device and inode of the store directory it was made for, so a copied store (another
inode) does not share its original's feed. Each feed directory records its store in
``owner.json``; a writer removes feed directories whose store is gone or no longer points to
them (nothing else frees that memory before a reboot).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

log = logging.getLogger("offgraph.feed")

POINTER = "feed.json"
SHM_ENV = "OFFGRAPH_FEED_SHM"
DIR_PREFIX = "offgraph-feed-"
OWNER = "owner.json"


class FeedUnsupported(OSError):
    """The write feed cannot run here (a CPU or a missing shared-memory directory). An
    OSError: the updater stops with it (nothing applied, nothing dead-lettered) and a
    follow-mode version is refused with it."""


def shm_root() -> Path:
    """The memory-backed directory that holds feed directories."""
    root = Path(os.environ.get(SHM_ENV) or "/dev/shm")
    if not root.is_dir():
        raise FeedUnsupported(
            errno.ENOENT,
            f"write feed: {root} is not a directory; the feed keeps its epochs in "
            f"memory-backed files there: mount a tmpfs at /dev/shm or set {SHM_ENV} to a "
            "tmpfs directory",
        )
    return root


def _identity(store: Path) -> list[int]:
    st = os.stat(store)
    return [st.st_dev, st.st_ino]


def _read_json(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _pointer_name(store: Path) -> str | None:
    """The feed directory name ``store``'s pointer names, if it is this directory's own."""
    d = _read_json(store / POINTER)
    if d is None or d.get("store") != _identity(store):
        return None
    name = d.get("dir")
    if not isinstance(name, str) or not name.startswith(DIR_PREFIX) or "/" in name or name in (".", ".."):
        return None
    return name


def feed_dir(store: str | Path) -> Path | None:
    """A follower's view: the store's feed directory (None while no writer made one)."""
    name = _pointer_name(Path(store))
    return None if name is None else shm_root() / name


def open_feed_dir(store: str | Path) -> Path:
    """The writer's: the store's feed directory, made (with its pointer) if need be."""
    store = Path(store)
    root = shm_root()
    name = _pointer_name(store)
    if name is None:
        name = f"{DIR_PREFIX}{uuid.uuid4().hex}"
        tmp = store / f".{POINTER}.tmp"
        tmp.write_text(json.dumps({"dir": name, "store": _identity(store)}))
        os.replace(tmp, store / POINTER)  # the pointer first: a directory without it is an orphan
    d = root / name
    d.mkdir(exist_ok=True)
    owner = d / OWNER
    if not owner.exists():
        owner.write_text(json.dumps({"store": str(store.resolve())}))
    remove_orphans(root, keep=name)
    return d


def remove_orphans(root: Path, keep: str) -> list[str]:
    """Delete feed directories (memory!) whose store is gone or no longer points to them.
    One without an owner file yet (being made) stays."""
    removed = []
    try:
        entries = [e for e in os.scandir(root) if e.name.startswith(DIR_PREFIX) and e.name != keep]
    except OSError:
        return removed
    for e in entries:
        owner = _read_json(Path(e.path) / OWNER)
        store = owner.get("store") if owner else None
        if not isinstance(store, str):
            continue
        try:
            gone = _pointer_name(Path(store)) != e.name
        except OSError:  # the store directory is gone (or unreadable: then it is kept)
            gone = not os.path.lexists(store)
        if gone:
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.name)
            log.info("feed: removed %s, the feed of a store that is gone (%s)", e.path, store)
    return removed
