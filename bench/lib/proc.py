"""A process tree's readouts from /proc: total PSS of a server's supervisor and all its children, its
major faults, disk reads and CPU time.

PSS (proportional set size) charges each shared page (the TensorFlow library mapped by every worker,
the page cache of a memory-mapped file) to the processes sharing it in equal parts, so the sum over
a tree counts every page once. Read from ``/proc/PID/smaps_rollup`` (one line per process, cheap
enough to sample 4 times a second; ``psutil``'s ``memory_full_info`` would walk all of ``smaps``).
"""

from __future__ import annotations

import os

import psutil


def _field(path: str, name: str) -> int:
    """The number after ``name`` on its line of a /proc file of ``name value ...`` lines (0: none)."""
    with open(path) as f:
        for line in f:
            if line.startswith(name):
                return int(line.split()[1])
    return 0


def _pss_kib(pid: int) -> int:
    return _field(f"/proc/{pid}/smaps_rollup", "Pss:")


def _tree_sum(pid: int, per_process) -> int:
    """Sum of ``per_process(pid)`` over ``pid`` and its live descendants (a process that exits
    meanwhile counts 0)."""
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += per_process(p.pid)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return total


def tree_pss_bytes(pid: int) -> int:
    """Sum of the PSS of ``pid`` and its live descendants."""
    return _tree_sum(pid, _pss_kib) << 10


def _major_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:  # majflt is field 12; the name (field 2) may hold spaces
        return int(f.read().rsplit(")", 1)[1].split()[9])


def tree_major_faults(pid: int) -> int:
    """Major page faults so far (pages read from disk on access: code, mapped files) of ``pid`` and its
    live descendants."""
    return _tree_sum(pid, _major_faults)


def _read_bytes(pid: int) -> int:
    return _field(f"/proc/{pid}/io", "read_bytes:")


def tree_read_bytes(pid: int) -> int:
    """Bytes read from storage so far (page-cache misses: what the disk served, not what the page cache
    did) by ``pid`` and its live descendants (``/proc/PID/io`` ``read_bytes``)."""
    return _tree_sum(pid, _read_bytes)


def page_cache_refaults() -> int:
    """The kernel's ``workingset_refault_file``: page-cache pages read again after being evicted."""
    return _field("/proc/vmstat", "workingset_refault_file ")


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time so far of a process and its live descendants (a server's workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                children.setdefault(int(_stat(int(entry))[1]), []).append(int(entry))
            except OSError:  # gone meanwhile
                pass
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = _stat(p)
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
        todo += children.get(p, [])
    return total / os.sysconf("SC_CLK_TCK")
