"""Delta sources: one interface, one module per backend, opened by a string URL.

    src = open_source("spool:/data/spool")        # scheme -> backend (SOURCES registry)
    src.seek(positions_recorded_in_the_store)     # {key: position}; {} : from the beginning
    for item in src.poll(max_items=64):           # in position order, after the cursor
        batch = item.read()                       # DeltaBatch or FeatureDeltaBatch (DeltaFormatError if malformed)
        ... store.write(..., meta={item.key: item.position.encode()})
        src.ack(item)                             # applied and recorded: clean up, advance

Semantics (every backend):

- A **position** is a string under a **position key** (bytes): the spool has one key
  (``b"spool_position"``), a broker one per partition. Positions of one key compare (as
  strings) in delivery order. The updater records, per key, the position of the last
  item of each applied batch IN THE STORE, in the same atomic batch as the rows; that
  record, never the source, decides what was applied. ``position_keys()`` lists the
  keys the updater must read back on start.
- ``seek({key: p})``: items at or before ``p`` under ``key`` are consumed; the source
  may clean them up (the spool moves leftover files to ``applied/``). ``poll`` then
  starts after them. A key that is absent (or None) starts from the beginning, or from
  ``version_start(version_dir)`` where the store of a new version holds no position.
- ``poll(n)`` returns up to ``n`` items after the cursor, in position order per key,
  without consuming them: polling again returns the same items until they are acked or
  rejected. An item the caller does not ack (e.g. one waiting for its model version)
  blocks the items behind it, so positions stay a valid high-water mark.
- ``ack(item)``: the item is applied and its position durably recorded; the source
  advances its cursor and cleans up (spool: move to ``applied/`` or delete). A crash
  before ``ack`` is harmless: after a restart ``seek`` skips what the store recorded.
- ``reject(item, reason)``: the item is not appliable; it goes to the dead letters
  (the spool: ``dead_letter_dir``, the item's bytes + ``<name>.reason.txt``) and the
  cursor moves past it.
- ``positions()``: the cursor, ``{key: last position consumed}``.
- ``pending()``: how many items wait after the cursor (for the lag metric);
  ``backlog()``: the same in items and rows, and how long the oldest has waited.
- ``wait(timeout)``: block until new items may have arrived (the spool: inotify) or
  ``timeout`` passes; ``interrupt()`` (any thread) ends a wait at once. The updater
  waits only when a poll found nothing to do, so an item that arrives while it is idle
  is applied at once, and one that arrives while it is busy joins the next batch.

Built in: ``spool:DIR`` (``spool.source``) and ``kafka://HOST:PORT/TOPIC`` (``kafka.source``);
another backend plugs in with :func:`register_source`.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from offgraph.streaming import deltas
from offgraph.streaming.deltas import AnyDeltaBatch

SPOOL_POSITION_KEY = b"spool_position"


@dataclass(frozen=True)
class SourceItem:
    """One unit of delivery: a delta file (spool) or a message payload (broker)."""

    position: str
    key: bytes = SPOOL_POSITION_KEY  # the position key (meta record) it advances
    path: Path | None = None
    payload: bytes | None = None
    late: bool = False  # it arrived after a later position was delivered (see the spool's notes)
    mtime: float = 0.0  # when it appeared (Unix seconds; for the wait timeout)
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else self.position

    def read(self) -> AnyDeltaBatch:
        return deltas.read(self.path if self.path is not None else self.payload or b"")


@dataclass(frozen=True)
class Backlog:
    """What waits after the cursor: items, their rows, and how long the oldest has waited."""

    items: int = 0
    rows: int = 0
    oldest_age_s: float = 0.0


class DeltaSource(abc.ABC):
    """Where deltas come from (see the module docstring for the contract)."""

    scheme = ""
    wakeup = "poll"  # how wait() learns of new items: "poll" (it sleeps), or e.g. "inotify"

    def __init__(self, dead_letter_dir: str | Path | None = None) -> None:
        self.dead_letter_dir = Path(dead_letter_dir) if dead_letter_dir else None
        self._interrupted = threading.Event()

    def wait(self, timeout: float) -> None:
        """Return when new items may be there, or after ``timeout`` seconds, or at
        :meth:`interrupt`. This default sleeps: a backend that can be told of new items
        overrides it."""
        self._interrupted.wait(timeout)
        self._interrupted.clear()

    def interrupt(self) -> None:
        """End a :meth:`wait` now (from any thread, e.g. a signal handler's stop)."""
        self._interrupted.set()

    def backlog(self) -> Backlog:
        """Items waiting after the cursor (as of the last poll), their rows and age."""
        return Backlog(self.pending())

    def lag(self) -> dict[int, dict]:
        """Per partition of a broker source: messages, rows and seconds behind ({} : none)."""
        return {}

    def connectivity(self) -> dict | None:
        """A broker source's connection state for /metrics (``{"up": bool | None, "errors": int,
        "resets": int}``); None: the source has no broker."""
        return None

    def position_keys(self) -> list[bytes]:
        """The position keys whose records the updater reads back on start."""
        return [SPOOL_POSITION_KEY]

    @abc.abstractmethod
    def seek(self, positions: dict[bytes, str | None]) -> None:
        """Resume after ``positions[key]`` for each key (absent or None: from the beginning)."""

    def version_start(self, version_dir: Path) -> dict[bytes, str]:
        """Where a version's deltas begin in this source (positions just before them), for a
        store that holds no position yet (a new replica); {} : from the beginning."""
        return {}

    @abc.abstractmethod
    def poll(self, max_items: int) -> list[SourceItem]:
        """Up to ``max_items`` items after the cursor, in position order."""

    @abc.abstractmethod
    def ack(self, item: SourceItem) -> None:
        """``item`` is applied and recorded: advance and clean up."""

    @abc.abstractmethod
    def reject(self, item: SourceItem, reason: str) -> Path | None:
        """Dead-letter ``item`` with ``reason``; returns where it went."""

    @abc.abstractmethod
    def pending(self) -> int:
        """Items waiting after the cursor (as of the last poll)."""

    @abc.abstractmethod
    def positions(self) -> dict[bytes, str]:
        """The cursor: the last position consumed under each key (keys with none: absent)."""

    def close(self) -> None:  # noqa: B027 (optional: most backends hold nothing to release)
        pass

    def describe(self) -> str:
        return self.scheme


SOURCES: dict[str, Callable[..., DeltaSource]] = {}


def register_source(scheme: str, factory: Callable[..., DeltaSource]) -> None:
    if not isinstance(scheme, str) or not scheme.isidentifier():
        raise ValueError(f"source scheme must be an identifier, got {scheme!r}")
    SOURCES[scheme] = factory


def open_source(url: str, **kwargs) -> DeltaSource:
    """``"spool:DIR"`` (or any registered ``scheme:rest``) -> a DeltaSource.
    kwargs go to the backend (spool: ``dead_letter_dir``, ``delete_applied``)."""
    if not isinstance(url, str) or ":" not in url:
        raise ValueError(f"source must be 'scheme:location' (e.g. 'spool:/data/spool'), got {url!r}")
    scheme, rest = url.split(":", 1)
    if scheme not in SOURCES:
        _load_builtin(scheme)
    if scheme not in SOURCES:
        raise ValueError(f"unknown source scheme {scheme!r} in {url!r}; known: {sorted(set(SOURCES) | set(_BUILTIN))}")
    if not rest:
        raise ValueError(f"source {url!r} names no location after '{scheme}:'")
    return SOURCES[scheme](rest, **kwargs)


_BUILTIN = {
    "spool": "offgraph.streaming.spool.source",
    "kafka": "offgraph.streaming.kafka.source",
}  # scheme -> module defining its DeltaSource (loaded on use)


def _load_builtin(scheme: str) -> None:
    if scheme in _BUILTIN:
        import importlib

        mod = importlib.import_module(_BUILTIN[scheme])
        cls = next(
            v for v in vars(mod).values() if isinstance(v, type) and issubclass(v, DeltaSource) and v.scheme == scheme
        )
        register_source(scheme, cls)


__all__ = ["Backlog", "DeltaSource", "SourceItem", "SPOOL_POSITION_KEY", "open_source", "register_source", "SOURCES"]
