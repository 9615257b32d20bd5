"""Files on disk and out of the page cache, and how much of a file the page cache holds, for the tests of
the prefetch, the disk probes and the plan. Residency is read with ``mincore(2)`` on a mapping of each
file, not through the code under test."""

import ctypes
import mmap
import os

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)


def resident_bytes(path) -> int:
    """Bytes of ``path`` in the page cache: mincore over a read-only shared mapping of it."""
    size = os.path.getsize(path)
    vec = (ctypes.c_ubyte * -(-size // mmap.PAGESIZE))()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        view = np.frombuffer(m, np.uint8)
        rc = _libc.mincore(ctypes.c_void_p(view.__array_interface__["data"][0]), ctypes.c_size_t(size), vec)
        del view  # the mapping cannot close while exported
    if rc != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return min(size, int((np.frombuffer(vec, np.uint8) & 1).sum()) * mmap.PAGESIZE)


def drop_from_cache(path) -> None:
    """``path``'s pages out of the page cache (written back first: dirty pages cannot be dropped)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def cold_file(path, mib: int):
    """A file of ``mib`` MiB on disk and out of the page cache."""
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 255, mib << 20, dtype=np.uint8).tobytes())
    drop_from_cache(path)
    assert resident_bytes(path) < (1 << 20), "the kernel kept the file cached: cannot test"
    return path
