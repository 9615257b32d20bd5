"""Spool file names and publishing: a delta file of any kind appears in a spool directory by an
atomic rename, under a name that sorts in the order files appear (offgraph/streaming/README.md)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np

from offgraph.streaming.deltas import _format
from offgraph.streaming.deltas._format import SUFFIX
from offgraph.streaming.deltas.rows import write_delta_file

_name_lock = threading.Lock()
_name_state = {"last": 0, "counter": 0}


def spool_file_name(seq_hint: int | None = None) -> str:
    """A spool file name that sorts (as a string) in creation order within a process:
    ``f"{lead:020d}-{pid:07d}-{counter:06d}.delta.arrow"``.

    ``lead`` is ``time.time_ns()`` made strictly increasing within the process (or
    ``seq_hint`` if the producer keeps its own monotone number, e.g. its newest seq;
    then the time-based settle guard of the spool source does not apply). Across
    processes names sort by wall-clock time: publish with :func:`publish_delta` (the
    name is taken right before the rename) so a file never appears after a
    later-named one was consumed.
    """
    with _name_lock:
        if seq_hint is None:
            lead = max(time.time_ns(), _name_state["last"] + 1)
        else:
            if isinstance(seq_hint, bool) or not isinstance(seq_hint, (int, np.integer)) or seq_hint < 0:
                raise ValueError(f"seq_hint must be an int >= 0, got {seq_hint!r}")
            lead = int(seq_hint)
        if lead >= 10**20:
            raise ValueError(f"seq_hint must be < 10**20, got {lead}")
        _name_state["last"] = max(_name_state["last"], lead)
        _name_state["counter"] = (_name_state["counter"] + 1) % 1_000_000
        return f"{lead:020d}-{os.getpid() % 10**7:07d}-{_name_state['counter']:06d}{SUFFIX}"


def publish_delta(spool_dir, **kwargs) -> Path:
    """Write a delta file into ``spool_dir`` (kwargs of :func:`write_delta_file`) under a
    hidden temporary name, then name it with :func:`spool_file_name` and rename it in:
    the name is taken at publish time, so names sort in the order files appear.
    Creates ``spool_dir`` if needed. Returns the published path."""
    fsync = kwargs.pop("fsync", True)
    return publish_file(spool_dir, lambda hidden: write_delta_file(hidden, fsync=fsync, **kwargs), fsync=fsync)


def publish_file(spool_dir, write, fsync: bool = True) -> Path:
    """Publish one spool file: ``write(path)`` writes it under a hidden temporary name (and fsyncs
    it if asked), then it is named with :func:`spool_file_name` and renamed in (and the directory
    fsynced). Every kind of spool file (row deltas, feature deltas) goes through here."""
    spool_dir = Path(spool_dir)
    spool_dir.mkdir(parents=True, exist_ok=True)
    hidden = spool_dir / f".publish-{os.getpid()}-{threading.get_ident()}{SUFFIX}"
    write(hidden)
    final = spool_dir / spool_file_name()
    os.replace(hidden, final)
    if fsync:
        _format.fsync_dir(spool_dir)
    return final


def parse_spool_name(name: str) -> int | None:
    """The leading number of a spool file name (None if it does not follow the pattern)."""
    return _format.parse_lead(name, SUFFIX)
