"""bench.lib.proc: sums over a process tree, read from /proc by the test itself for comparison."""

import os
import subprocess
import sys
import time

from page_cache_files import cold_file

from bench.lib.proc import page_cache_refaults, tree_major_faults, tree_pss_bytes, tree_read_bytes

CHILD = """
import mmap, sys, time
f = open(sys.argv[1], "rb"); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("ready", flush=True); sys.stdin.readline()
s = sum(m[i] for i in range(0, len(m), 4096))  # touch every page of the cold file: major faults
print("touched", s >= 0, flush=True); sys.stdin.readline()
"""


def _majflt(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[9])


def _read_bytes(pid: int) -> int:
    return next(int(line.split()[1]) for line in open(f"/proc/{pid}/io") if line.startswith("read_bytes:"))


def _pss(pid: int) -> int:
    return next(int(line.split()[1]) for line in open(f"/proc/{pid}/smaps_rollup") if line.startswith("Pss:")) << 10


def test_the_tree_counts_a_child_and_its_major_faults(tmp_path):
    path = cold_file(tmp_path / "cold.bin", 8)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        me = os.getpid()
        before_tree, before_child = tree_major_faults(me), _majflt(child.pid)
        read_tree, read_child = tree_read_bytes(me), _read_bytes(child.pid)
        assert read_tree >= _read_bytes(me) + read_child
        assert before_tree >= _majflt(me) + before_child
        pss = tree_pss_bytes(me)
        assert pss >= 0.8 * (_pss(me) + _pss(child.pid)) and pss > _pss(me)
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "touched True"
        gained = _majflt(child.pid) - before_child
        assert gained >= 1  # the cold pages came from disk (readahead makes it fewer than 2048)
        assert tree_major_faults(me) - before_tree >= gained
        read = _read_bytes(child.pid) - read_child
        assert read >= 4096  # the faults read the cold file from the disk
        assert tree_read_bytes(me) - read_tree >= read
        # the kernel's counter, read here from /proc/vmstat independently: a monotone count between two reads
        before = page_cache_refaults()
        vmstat = dict(line.split() for line in open("/proc/vmstat"))
        assert before <= int(vmstat["workingset_refault_file"]) <= page_cache_refaults()
    finally:
        child.kill()
        child.wait(10)
    time.sleep(0.05)
    assert tree_major_faults(child.pid) == 0 and tree_pss_bytes(child.pid) == 0  # gone: counts nothing
    assert tree_read_bytes(child.pid) == 0
