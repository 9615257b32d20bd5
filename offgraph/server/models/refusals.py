"""When a refused version is tried again: once its files changed, after a backoff that doubles.

A version copied slowly (its manifest first, dense/ or store/ later) is refused while its files
are missing; it must be retried when they arrive, and a version that is broken for good must not
be reloaded every poll. The signature is the names, sizes and mtimes of every file under the
version directory (a directory walk, no file is read), except the files that opening a store
rewrites by itself (``UNSIGNED``); an unchanged signature is never retried.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from offgraph.server.models.served import Refusal

RETRY_MAX_S = 60.0
"""Longest wait between two tries of a refused version whose files keep changing."""


UNSIGNED = ("rocksdict-config.json", "LOCK", "LOG")
"""Files (or name prefixes: RocksDB's info logs LOG, LOG.old.*) that any open of a shard rewrites, even a
read-only one: were they signed, every failed try would change the signature and be retried."""


def version_signature(version_dir: Path) -> tuple:
    out = []
    for dirpath, dirs, files in os.walk(version_dir):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(UNSIGNED):
                continue
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue  # removed meanwhile: the signature still changes
            out.append((os.path.relpath(os.path.join(dirpath, name), version_dir), st.st_size, st.st_mtime_ns))
    return tuple(out)


def refuse(previous: Refusal | None, reason: str, signature: tuple, first_wait_s: float) -> Refusal:
    """The refusal after one more failure (``signature``: the files as they were when the try began)."""
    attempts = previous.attempts + 1 if previous is not None else 1
    wait = min(RETRY_MAX_S, first_wait_s * 2 ** (attempts - 1))
    return Refusal(reason, signature, attempts, time.monotonic() + wait)


def may_retry(refusal: Refusal | None, version_dir: Path) -> bool:
    """No refusal, or the version's files changed since and its backoff has passed."""
    if refusal is None:
        return True
    return time.monotonic() >= refusal.retry_at and version_signature(version_dir) != refusal.signature
