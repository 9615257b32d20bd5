"""``spool:DIR``: delta files that appear in a local directory by atomic rename.

- Consumed: regular files named ``*.delta.arrow`` not starting with ``.``, in name
  order (``spool_file_name`` names sort in creation order). Everything else
  (``*.tmp``, hidden publish files, ``applied/``, ``dead/``) is ignored.
- Position = the file name. After an apply (``ack``) the file moves to ``DIR/applied/``
  (or is deleted with ``delete_applied``); correctness does not depend on that move:
  the updater records the position in the store, and ``seek`` treats every file at or
  before it as consumed (it only tidies such leftovers into ``applied/``).
- Rejected files go to ``dead_letter_dir`` (default ``DIR/dead/``) with
  ``<name>.reason.txt`` (the reason is written first, then the file is moved).
- Ordering: a file that appears after a later-named one was delivered (two producers
  naming files before a slow write, clock steps) is delivered anyway with
  ``late=True`` (per-row seqs keep last-write-wins); only a crash of the updater
  between its arrival and its apply can skip it (its name is at or before the
  recorded position). ``publish_delta`` names files at rename time to avoid it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from pathlib import Path

from offgraph.streaming.deltas import SUFFIX, count_rows
from offgraph.streaming.log_limit import RepeatLimiter
from offgraph.streaming.sources import SPOOL_POSITION_KEY, Backlog, DeltaSource, SourceItem
from offgraph.streaming.spool.watch import DirWatch

log = logging.getLogger("offgraph.update.spool")

APPLIED_DIR = "applied"
DEAD_DIR = "dead"
REASON_SUFFIX = ".reason.txt"


def reason_file_name(name: str) -> str:
    """``<name>.reason.txt``, or, where that is longer than a file name may be, the name
    cut short with a hash of the whole (the reason text names the file in full)."""
    full = name + REASON_SUFFIX
    if len(os.fsencode(full)) <= 255:
        return full
    digest = hashlib.sha1(os.fsencode(name)).hexdigest()[:16]
    return os.fsencode(name)[:200].decode("utf-8", "ignore") + f"-{digest}{REASON_SUFFIX}"


class SpoolSource(DeltaSource):
    scheme = "spool"

    def __init__(
        self, directory: str | Path, *, dead_letter_dir: str | Path | None = None, delete_applied: bool = False
    ) -> None:
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"spool {directory} exists and is not a directory")
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(dead_letter_dir or directory / DEAD_DIR)
        self.dir = directory
        self.applied_dir = directory / APPLIED_DIR
        self.delete_applied = bool(delete_applied)
        self._cursor: str | None = None
        self._handled: set[str] = set()  # acked/rejected here, maybe still listed
        self._todo: list[str] = []  # files after the cursor, as of the last poll
        self._rows: dict[str, int] = {}  # rows of files in _todo (a published file never changes)
        self._watch = DirWatch.open(directory, _consumed)
        self._retire_log = RepeatLimiter(log)  # an unwritable spool fails every file the same way
        self.wakeup = self._watch.mode

    # -- DeltaSource ----------------------------------------------------------------
    def positions(self) -> dict[bytes, str]:
        return {} if self._cursor is None else {SPOOL_POSITION_KEY: self._cursor}

    def seek(self, positions: dict[bytes, str | None]) -> None:
        position = positions.get(SPOOL_POSITION_KEY)
        self._cursor = position
        if position is None:
            return
        leftovers = [n for n in self._list() if n <= position]
        for name in leftovers:  # applied before a restart, not yet moved
            self._handled.add(name)
            self._retire(self.dir / name)
        if leftovers:
            log.info(
                "spool %s: %d file(s) at or before the recorded position %s were applied before; tidied into %s/",
                self.dir,
                len(leftovers),
                position,
                APPLIED_DIR,
            )

    def poll(self, max_items: int) -> list[SourceItem]:
        if max_items < 1:
            raise ValueError(f"max_items must be >= 1, got {max_items}")
        names = self._list()
        self._handled.intersection_update(names)
        todo = [n for n in names if n not in self._handled]
        self._todo = todo
        out = []
        for name in todo[:max_items]:
            path = self.dir / name
            try:
                mtime = path.stat().st_mtime
            except FileNotFoundError:  # taken away meanwhile
                continue
            late = self._cursor is not None and name <= self._cursor
            out.append(SourceItem(position=name, path=path, late=late, mtime=mtime))
        return out

    def ack(self, item: SourceItem) -> None:
        self._advance(item)
        self._retire(item.path)

    def reject(self, item: SourceItem, reason: str) -> Path | None:
        dead = self.dead_letter_dir
        dead.mkdir(parents=True, exist_ok=True)
        target = dead / item.name
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        why = dead / reason_file_name(item.name)
        shown = os.fsencode(item.name).decode("utf-8", "backslashreplace")  # a name need not be UTF-8
        why.write_text(f"{stamp} {shown}: {reason}\n", encoding="utf-8", errors="backslashreplace")
        try:
            os.replace(item.path, target)
        except FileNotFoundError:
            log.warning("spool %s: %s vanished before it could be dead-lettered", self.dir, item.name)
        self._advance(item)
        return target

    def pending(self) -> int:
        return sum(n not in self._handled for n in self._todo)

    def backlog(self, max_counts: int = 256) -> Backlog:
        """Files after the cursor, their rows and the oldest one's age. Rows are read from
        the files' Arrow footers, each file once and at most ``max_counts`` new ones a call
        (bounded work for a sudden flood): files not yet counted are taken at the mean of
        the others."""
        todo = [n for n in self._todo if n not in self._handled]  # as of the last poll, less what was done since
        if not todo:
            self._rows.clear()
            return Backlog()
        if len(self._rows) > 2 * len(todo):
            self._rows = {n: self._rows[n] for n in todo if n in self._rows}
        counted = 0
        for name in todo:
            if name in self._rows:
                continue
            if counted == max_counts:
                break
            self._rows[name] = count_rows(self.dir / name)
            counted += 1
        known = [self._rows[n] for n in todo if n in self._rows]
        rows = sum(known) + round((len(todo) - len(known)) * (sum(known) / max(len(known), 1)))
        try:
            age = max(0.0, time.time() - (self.dir / todo[0]).stat().st_mtime)
        except OSError:  # applied meanwhile
            age = 0.0
        return Backlog(len(todo), int(rows), age)

    def wait(self, timeout: float) -> None:
        self._watch.wait(timeout)

    def interrupt(self) -> None:
        self._watch.interrupt()

    def close(self) -> None:
        self._watch.close()

    def describe(self) -> str:
        return f"spool:{self.dir}"

    # -- helpers ----------------------------------------------------------------------
    def _advance(self, item: SourceItem) -> None:
        self._handled.add(item.name)
        if self._cursor is None or item.position > self._cursor:
            self._cursor = item.position

    def _list(self) -> list[str]:
        out = []
        with os.scandir(self.dir) as it:
            for e in it:
                if _consumed(e.name) and e.is_file(follow_symlinks=False):
                    out.append(e.name)
        out.sort()
        return out

    def _retire(self, path: Path | None) -> None:
        if path is None:
            return
        try:
            if self.delete_applied:
                path.unlink()
            else:
                self.applied_dir.mkdir(exist_ok=True)
                os.replace(path, self.applied_dir / path.name)
        except FileNotFoundError:
            pass
        except OSError as e:  # harmless: the position recorded in the store decides
            self._retire_log.log(
                logging.WARNING, "spool %s: could not retire %s: %s", self.dir, path.name, e, key=(type(e), e.errno)
            )


def _consumed(name: str) -> bool:
    """Whether a file of this name in the spool is a delta to apply (not temporary, not hidden)."""
    return name.endswith(SUFFIX) and not name.startswith(".")
