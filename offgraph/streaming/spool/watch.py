"""Wake the spool's reader when a delta file lands: inotify on Linux, a plain sleep elsewhere.

    watch = DirWatch.open(spool_dir, accept=lambda name: name.endswith(".delta.arrow"))
    watch.wait(0.5)      # returns at once if an accepted file landed since the last wait
    watch.interrupt()    # from any thread: end a wait now

Producers publish by rename (IN_MOVED_TO) or write in place and close (IN_CLOSE_WRITE).
Events are queued by the kernel from the moment the watch exists, so a file that lands
between the reader's listing and its wait still ends that wait. A queue overflow counts
as a wake-up (the reader lists the directory anyway). Where inotify cannot be had (not
Linux, the user's watch limit reached, a file system without it) ``open`` returns a
:class:`SleepWatch` and the reader falls back to polling.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("offgraph.update.spool")


class SleepWatch:
    """The fallback: ``wait`` sleeps for its timeout (or until interrupted)."""

    mode = "poll"

    def __init__(self) -> None:
        self._event = threading.Event()

    def wait(self, timeout: float) -> None:
        self._event.wait(timeout)
        self._event.clear()

    def interrupt(self) -> None:
        self._event.set()

    def close(self) -> None:
        pass


class DirWatch:
    """inotify on one directory (not its subdirectories)."""

    mode = "inotify"

    def __init__(self, directory: Path, accept: Callable[[str], bool]) -> None:
        from inotify_simple import INotify, flags

        self._accept = accept
        self._ino = INotify()
        try:
            self._ino.add_watch(os.fspath(directory), flags.MOVED_TO | flags.CLOSE_WRITE)
            self._rd, self._wr = os.pipe()
        except BaseException:
            self._ino.close()
            raise
        os.set_blocking(self._wr, False)
        self._overflow = flags.Q_OVERFLOW
        self._closed = False

    @classmethod
    def open(cls, directory: Path, accept: Callable[[str], bool]) -> DirWatch | SleepWatch:
        try:
            return cls(directory, accept)
        except (ImportError, OSError) as e:  # no inotify here, or no watch left (fs.inotify.max_user_watches)
            log.warning("spool %s: no inotify (%s); polling instead", directory, e)
            return SleepWatch()

    def wait(self, timeout: float) -> None:
        end = time.monotonic() + max(0.0, timeout)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            ready, _, _ = select.select([self._ino.fileno(), self._rd], [], [], left)
            if not ready:
                return
            if self._rd in ready:
                os.read(self._rd, 4096)
                return
            if any(e.mask & self._overflow or self._accept(e.name) for e in self._ino.read(timeout=0)):
                return
            # only files the reader ignores (temporary, hidden): keep waiting

    def interrupt(self) -> None:
        try:
            os.write(self._wr, b"x")
        except (BlockingIOError, OSError):  # the pipe is full (a wake-up is pending) or closed
            pass

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._ino.close()
            os.close(self._rd)
            os.close(self._wr)
