"""The device's own random-read latency, at a queue depth: the number the read-time model starts from.

Reads are ``O_DIRECT`` (aligned offsets, into page-aligned ``mmap`` buffers), so the page cache is
neither used nor changed: the probe measures what a store opened with direct reads waits for on a
miss, without warming or evicting anything a measurement that follows depends on. A queue depth of
``d`` is ``d`` threads each issuing one read at a time; ``os.preadv`` releases the GIL while it
waits, so the reads really are in flight together.

Files the probe cannot read direct from a device raise ``DirectIOUnsupported`` with the reason:
a filesystem that refuses ``O_DIRECT``, and one held in memory (tmpfs, ramfs: since Linux 6.6 tmpfs
accepts ``O_DIRECT`` and serves it from memory, which would be passed off as the disk's latency).
"""

from __future__ import annotations

import mmap
import os
import random
import threading
import time
from pathlib import Path

MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs", "rootfs"})
ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffers aligned to the logical block size (<= 4 KiB here)
DEFAULT_BLOCK_BYTES = 16 << 10  # RocksDB's data block size in this store (offgraph.store.rocksdb_options)


class DirectIOUnsupported(OSError):
    """The files cannot be read with ``O_DIRECT`` (the filesystem refuses it, or no file is big enough)."""


def filesystem_type(path) -> str | None:
    """The type of the filesystem holding ``path`` (the mount point that is its longest prefix), or None."""
    import psutil

    real = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for part in psutil.disk_partitions(all=True):
        mp = part.mountpoint.rstrip("/") or "/"
        if (real == mp or real.startswith(mp + "/") or mp == "/") and (best is None or len(mp) > best[0]):
            best = (len(mp), part.fstype)
    return best[1] if best else None


def _open_direct(files: list[Path], block_bytes: int) -> list[tuple[int, int]]:
    """``(fd, size)`` of each file at least two blocks long, opened ``O_DIRECT`` and checked with one
    read (some filesystems accept the flag at open and refuse the read)."""
    if not hasattr(os, "O_DIRECT"):
        raise DirectIOUnsupported("this platform has no O_DIRECT")
    big = [Path(p) for p in files if os.path.getsize(p) >= 2 * block_bytes]
    if not big:
        raise DirectIOUnsupported(f"no file of at least {2 * block_bytes} bytes to probe (of {len(files)} given)")
    fds: list[tuple[int, int]] = []
    buf = mmap.mmap(-1, block_bytes)
    try:
        for p in big:
            fs = filesystem_type(p)
            if fs in MEMORY_FILESYSTEMS:
                raise DirectIOUnsupported(f"{p} is on {fs}, held in memory: its reads do not measure a disk")
            try:
                fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
            except OSError as e:
                raise DirectIOUnsupported(f"{p}: the filesystem refuses O_DIRECT reads ({e.strerror})") from e
            fds.append((fd, os.fstat(fd).st_size))
            try:
                os.preadv(fd, [buf], 0)
            except OSError as e:
                raise DirectIOUnsupported(f"{p}: an O_DIRECT read fails ({e.strerror})") from e
    except BaseException:
        for fd, _ in fds:
            os.close(fd)
        raise
    finally:
        buf.close()
    return fds


def direct_reads(
    files, depth: int, seconds: float, block_bytes: int = DEFAULT_BLOCK_BYTES, seed: int = 0
) -> tuple[list[float], float]:
    """Random aligned ``block_bytes`` ``O_DIRECT`` reads over ``files`` by ``depth`` threads for
    ``seconds``: each read's latency in seconds, and the wall time they took together."""
    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    if block_bytes < ALIGN or block_bytes % ALIGN:
        raise ValueError(f"block_bytes must be a multiple of {ALIGN}, got {block_bytes}")
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    fds = _open_direct(list(files), block_bytes)
    lat: list[list[float]] = [[] for _ in range(depth)]
    errors: list[OSError] = []
    end = time.perf_counter() + seconds

    def reader(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        buf = mmap.mmap(-1, block_bytes)  # page-aligned
        out, clock = lat[i], time.perf_counter
        try:
            while clock() < end:
                fd, size = fds[rng.randrange(len(fds))]
                off = rng.randrange(0, size - block_bytes) // ALIGN * ALIGN
                t = clock()
                os.preadv(fd, [buf], off)
                out.append(clock() - t)
        except OSError as e:
            errors.append(e)
        finally:
            buf.close()

    threads = [threading.Thread(target=reader, args=(i,), name=f"probe-{i}", daemon=True) for i in range(depth)]
    t0 = time.perf_counter()
    stuck = False
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)  # a read never takes a minute on a working disk; do not hang on one that does
        wall = time.perf_counter() - t0
        stuck = any(t.is_alive() for t in threads)
    finally:
        if not stuck:  # a stuck reader keeps its descriptor: closing it could hand the number to another file
            for fd, _ in fds:
                os.close(fd)
    if stuck:
        raise OSError(f"an O_DIRECT read did not return within {seconds + 60:.0f} s")
    if errors:
        raise errors[0]
    return [x for per in lat for x in per], wall


def summarize(lat_s: list[float], wall_s: float, depth: int, block_bytes: int) -> dict:
    """The figures of a probe: reads, reads_per_s, mean/p50/p99/p999/max in ms."""
    import numpy as np

    ms = np.asarray(lat_s, dtype=np.float64) * 1e3
    if not len(ms):
        raise DirectIOUnsupported("no read completed in the probe's time")
    p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
    return {
        "reads": int(len(ms)),
        "reads_per_s": float(len(ms) / wall_s),
        "mean_ms": float(ms.mean()),
        "p50_ms": float(p50),
        "p99_ms": float(p99),
        "p999_ms": float(p999),
        "max_ms": float(ms.max()),
        "depth": int(depth),
        "block_bytes": int(block_bytes),
        "seconds": float(wall_s),
    }


def direct_read_latency(
    files, depth: int, seconds: float, block_bytes: int = DEFAULT_BLOCK_BYTES, seed: int = 0
) -> dict:
    """The device's random ``O_DIRECT`` read latency at queue depth ``depth`` (``summarize``'s figures).
    Raises ``DirectIOUnsupported`` (an OSError, with the reason) where the files cannot be read direct."""
    lat, wall = direct_reads(files, depth, seconds, block_bytes, seed)
    return summarize(lat, wall, depth, block_bytes)


def device_profile(files, seconds: float, depths=(1, 8), block_bytes: int = DEFAULT_BLOCK_BYTES, seed: int = 0) -> dict:
    """``{"qd1": ..., "qd8": ...}``: ``direct_read_latency`` at each depth, ``seconds`` each."""
    files = list(files)
    return {f"qd{d}": direct_read_latency(files, d, seconds, block_bytes, seed) for d in depths}


def describe_profile(profile: dict) -> str:
    """One line per depth, for logs and bench output."""
    return "; ".join(
        f"{k}: {p['block_bytes'] >> 10}-KiB direct reads mean {p['mean_ms']:.3f} p50 {p['p50_ms']:.3f} "
        f"p99 {p['p99_ms']:.2f} ms, {p['reads_per_s']:,.0f} reads/s"
        for k, p in profile.items()
    )
