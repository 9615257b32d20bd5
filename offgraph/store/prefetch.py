"""Reading a store's files into the OS page cache ahead of requests, when they fit.

RocksDB reads one data block per lookup and leaves caching those blocks to the OS. A block no
request has read yet is read from disk on the request path, and a virtual disk's random reads are
slow in the tail, far slower than its median (``bench/results/disk-probe/README.md``). A version whose files
fit in memory comfortably is therefore read into the page cache once, sequentially, in the
background (``sendfile`` to ``/dev/null``: the kernel reads the pages and copies nothing, so it costs
almost no CPU and no GIL). Tables bigger than that (the point of out-of-graph serving) are not:
their blocks come from disk as requests need them.

Page-cache pages are not part of a process's PSS; the kernel reclaims them under pressure.

A store read with direct I/O (``StoreConfig.direct_reads``, the default) never reads the page cache:
``auto`` then means off. ``on`` still reads the files in (asked for by name).

The prefetch thread's reads are in the idle I/O class (``ioprio_set``): the block layer's scheduler
(mq-deadline, bfq) dispatches them only when no other read waits, so a request's cold read never
queues behind the prefetch's sequential ones, while on an idle disk the prefetch runs at full speed.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal, get_args

import psutil

from offgraph.store.open import backend_class, store_backend
from offgraph.store.store_file import read_store_file

log = logging.getLogger("offgraph.store")

PrefetchMode = Literal["auto", "on", "off"]
PREFETCH_MODES = get_args(PrefetchMode)
AUTO_SHARE_OF_AVAILABLE = 0.5  # "auto": the files may take at most this share of the available memory
CHUNK_BYTES = 2 << 20  # small reads between pauses: a request's random read never queues behind much
SERVING_DISK_SHARE = 0.5
"""While requests are served, the prefetch spends at most this share of the time reading (on top of
the rate limit): a scheduler that ignores I/O classes (``none``) queues a request's cold read behind
its reads, so a contended disk must slow the prefetch down, not the requests."""


def idle_io_priority() -> str | None:
    """Put the calling thread's disk reads in the idle I/O class; returns the class the kernel then
    reports for it (``"idle"``), or None where it cannot be set (the read still goes on)."""
    try:
        me = psutil.Process(threading.get_native_id())  # a thread id: ioprio_set(IOPRIO_WHO_PROCESS) on it
        me.ionice(psutil.IOPRIO_CLASS_IDLE)
        return me.ionice().ioclass.name.removeprefix("IOPRIO_CLASS_").lower()
    except (OSError, psutil.Error, AttributeError, ValueError):  # not Linux, or not permitted
        return None


def store_files(store_dir: str | Path) -> list[Path]:
    """The files that hold a store's rows (its backend's ``data_files``; RocksDB: ``shard-*/*.sst``),
    biggest first."""
    files = store_backend(store_dir).data_files(store_dir)
    return sorted(files, key=lambda p: p.stat().st_size, reverse=True)


def available_bytes() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def store_reads_direct(store_dir: str | Path) -> bool:
    """Whether the store at ``store_dir``, opened with the settings it records, reads with O_DIRECT."""
    config = read_store_file(os.fspath(store_dir))
    return config is not None and backend_class(config.backend).reads_direct(store_dir, config)


def decide(mode: str, total_bytes: int, available: int | None = None, direct: bool = False) -> tuple[bool, str]:
    """Whether to prefetch ``total_bytes`` of files, and why (for the log); ``direct``: the store reads
    its files with O_DIRECT (``store_reads_direct``)."""
    if mode not in PREFETCH_MODES:
        raise ValueError(f"prefetch mode must be one of {PREFETCH_MODES}, got {mode!r}")
    if mode == "off":
        return False, "prefetch off"
    if mode == "on":
        return True, "prefetch on"
    if direct:
        return False, "the store is read with direct I/O, past the page cache"
    available = available_bytes() if available is None else available
    limit = int(available * AUTO_SHARE_OF_AVAILABLE)
    if total_bytes <= limit:
        return True, f"{total_bytes / 2**30:.2f} GiB fit in {AUTO_SHARE_OF_AVAILABLE:.0%} of the available memory"
    return False, (
        f"{total_bytes / 2**30:.2f} GiB are more than {AUTO_SHARE_OF_AVAILABLE:.0%} of the available "
        f"memory ({available / 2**30:.2f} GiB): blocks are read from disk as requests need them"
    )


class Prefetcher:
    """Reads ``files`` into the page cache on a daemon thread; ``stop()`` ends it early, ``wait()``
    waits for it. ``max_mb_s`` bounds the read rate (0: none) and ``disk_share`` the share of the
    time spent reading (1: all), so that requests that still read the disk keep most of it.
    ``on_done(self)`` is called on its thread when it ends (e.g. to log)."""

    def __init__(
        self,
        files: list[Path],
        max_mb_s: float = 0.0,
        name: str = "prefetch",
        on_done: Callable[[Prefetcher], None] | None = None,
        disk_share: float = 1.0,
    ) -> None:
        if isinstance(max_mb_s, bool) or not isinstance(max_mb_s, (int, float)) or max_mb_s < 0:
            raise ValueError(f"max_mb_s must be a number >= 0, got {max_mb_s!r}")
        if isinstance(disk_share, bool) or not isinstance(disk_share, (int, float)) or not 0 < disk_share <= 1:
            raise ValueError(f"disk_share must be a number in (0, 1], got {disk_share!r}")
        self.disk_share = float(disk_share)
        self.busy_seconds = 0.0  # time spent in reads
        self.files = list(files)
        self.total_bytes = sum(p.stat().st_size for p in self.files)
        self.max_mb_s = float(max_mb_s)
        self._on_done = on_done
        self.done_bytes = 0
        self.seconds = 0.0
        self.error: str | None = None
        self.io_class: str | None = None  # the prefetch thread's I/O class once it runs ("idle")
        self._stop = threading.Event()
        self._finished = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        t0 = time.perf_counter()
        self.io_class = idle_io_priority()
        try:
            with open(os.devnull, "wb") as null:
                for path in self.files:
                    if self._stop.is_set():
                        break
                    self._read_file(path, null.fileno())
        except OSError as e:  # a file removed meanwhile, a read error: the cache is an aid, never a failure
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.seconds = time.perf_counter() - t0
            self._finished.set()
            if self._on_done is not None:
                self._on_done(self)

    def _read_file(self, path: Path, null_fd: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            offset = 0
            while offset < size and not self._stop.is_set():
                start = time.perf_counter()
                n = os.sendfile(null_fd, fd, offset, min(CHUNK_BYTES, size - offset))
                if n <= 0:
                    break
                offset += n
                self.done_bytes += n
                took = time.perf_counter() - start
                self.busy_seconds += took
                # each chunk takes at least its share of time from its own start (time a slow disk
                # took is not made up later by a burst of reads), and at most disk_share of the time
                # reading: a contended disk (slower chunks) makes the pauses longer
                rate_pause = n / (self.max_mb_s * 2**20) - took if self.max_mb_s > 0 else 0.0
                pause = max(rate_pause, took * (1 / self.disk_share - 1))
                if pause > 0:
                    self._stop.wait(pause)
        finally:
            os.close(fd)

    def wait(self, timeout: float | None = None) -> bool:
        """True once the prefetch has ended (finished, stopped or failed)."""
        return self._finished.wait(timeout)

    def stop(self) -> None:
        self._stop.set()

    @property
    def finished(self) -> bool:
        return self._finished.is_set()
