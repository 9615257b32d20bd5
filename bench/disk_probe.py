"""The disk's own latency in the same run: cold random 16-KiB reads of a version's files.

Reads use ``O_DIRECT``, so the page cache is neither used nor changed: the probe measures the device
the server's cold block reads go to, without warming or evicting anything the measurement that
follows depends on. Latency figures of a server reading a table bigger than memory move with this
(on the development VM its tail moved by 3x between two probes an hour apart).
"""
from __future__ import annotations

import mmap
import os
import random
import time
from pathlib import Path

import numpy as np

READ_BYTES = 16 << 10


def cold_reads(files: list[Path], seconds: float = 10.0, seed: int = 0) -> dict | None:
    """Random aligned ``READ_BYTES`` reads spread over ``files`` for ``seconds``: their count and
    p50/p99/p99.9/max in ms, and how many took over 100 ms. None where ``O_DIRECT`` is not supported
    (e.g. tmpfs) or no file is big enough."""
    files = [Path(p) for p in files if os.path.getsize(p) >= 2 * READ_BYTES]
    if not files or not hasattr(os, "O_DIRECT"):
        return None
    try:
        fds = [os.open(p, os.O_RDONLY | os.O_DIRECT) for p in files]
    except OSError:
        return None
    buf = mmap.mmap(-1, READ_BYTES)  # page-aligned, as O_DIRECT wants
    rng = random.Random(seed)
    lat: list[float] = []
    try:
        sizes = [os.fstat(fd).st_size for fd in fds]
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            k = rng.randrange(len(fds))
            off = rng.randrange(0, sizes[k] - READ_BYTES) // 4096 * 4096
            t = time.perf_counter()
            os.preadv(fds[k], [buf], off)
            lat.append(time.perf_counter() - t)
    except OSError:  # O_DIRECT refused at the first read (some filesystems)
        if not lat:
            return None
    finally:
        for fd in fds:
            os.close(fd)
        buf.close()
    ms = np.array(lat) * 1e3
    p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
    return {"reads": int(len(ms)), "p50_ms": float(p50), "p99_ms": float(p99), "p999_ms": float(p999),
            "max_ms": float(ms.max()), "over_100ms": int((ms > 100).sum()), "seconds": float(seconds)}


def describe(probe: dict | None) -> str:
    if not probe:
        return "disk probe: n/a"
    return (f"cold 16-KiB reads p50 {probe['p50_ms']:.2f} p99 {probe['p99_ms']:.1f} p99.9 {probe['p999_ms']:.0f} "
            f"max {probe['max_ms']:.0f} ms ({probe['over_100ms']} of {probe['reads']} over 100 ms)")


def settle(files: list[Path], limit_ms: float, max_s: float, probe_s: float = 5.0, pause_s: float = 25.0,
           probe=cold_reads, sleep=time.sleep, clock=time.monotonic) -> dict:
    """Probe ``files`` (``probe_s`` each, ``pause_s`` apart) until the cold reads' p99.9 is at most
    ``limit_ms`` or ``max_s`` have passed. Right after a 10^9-row synth (27 GB written) this VM's
    disk read slowly (probes before the first 10^9 run: p99.9 60-112 ms, single reads near 1 s;
    8-43 ms in the runs after): a measurement started then measures the disk, not the server.
    Returns ``{"settled": True/False (None: the files cannot be probed), "waited_s", "probes"}``."""
    t0 = clock()
    probes: list[dict] = []
    while True:
        p = probe(files, probe_s)
        if p is None:
            return {"settled": None, "waited_s": clock() - t0, "probes": probes}
        probes.append(p)
        if p["p999_ms"] <= limit_ms:
            return {"settled": True, "waited_s": clock() - t0, "probes": probes}
        if clock() - t0 + pause_s + probe_s > max_s:
            return {"settled": False, "waited_s": clock() - t0, "probes": probes}
        sleep(pause_s)
