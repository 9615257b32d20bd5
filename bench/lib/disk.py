"""The disk's own latency in the same run: cold random 16-KiB reads of a version's files.

Reads use ``O_DIRECT``, so the page cache is neither used nor changed: the probe measures the device
the server's cold block reads go to, without warming or evicting anything the measurement that
follows depends on. The reads are ``offgraph.store.device_probe``'s (``offgraph plan`` uses it too). Latency
figures of a server reading a table bigger than memory move with this (a virtual disk's tail moves
between probes an hour apart: bench/results/disk-probe/README.md).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from offgraph.store.device_probe import DEFAULT_BLOCK_BYTES, DirectIOUnsupported, direct_reads, summarize

READ_BYTES = DEFAULT_BLOCK_BYTES


def cold_reads(files: list[Path], seconds: float = 10.0, seed: int = 0) -> dict | None:
    """Random aligned ``READ_BYTES`` reads spread over ``files`` for ``seconds``, one at a time
    (``offgraph.store.device_probe`` at depth 1): their count and p50/p99/p99.9/max in ms, and how many took
    over 100 ms. None where the files cannot be read direct from a device (tmpfs, no file big enough)."""
    try:
        lat, wall = direct_reads(files, 1, seconds, READ_BYTES, seed)
    except DirectIOUnsupported:
        return None
    return {**summarize(lat, wall, 1, READ_BYTES), "over_100ms": int((np.asarray(lat) > 0.1).sum())}


def describe(probe: dict | None) -> str:
    if not probe:
        return "disk probe: n/a"
    return (
        f"cold 16-KiB reads p50 {probe['p50_ms']:.2f} p99 {probe['p99_ms']:.1f} p99.9 {probe['p999_ms']:.0f} "
        f"max {probe['max_ms']:.0f} ms ({probe['over_100ms']} of {probe['reads']} over 100 ms)"
    )


def settle(
    files: list[Path],
    limit_ms: float,
    max_s: float,
    probe_s: float = 5.0,
    pause_s: float = 25.0,
    probe=cold_reads,
    sleep=time.sleep,
    clock=time.monotonic,
) -> dict:
    """Probe ``files`` (``probe_s`` each, ``pause_s`` apart) until the cold reads' p99.9 is at most
    ``limit_ms`` or ``max_s`` have passed. Right after a big synth a virtual disk can read slowly for a
    while (bench/results/disk-probe/README.md): a measurement started then measures the disk, not the
    server.
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
