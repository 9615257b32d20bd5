"""Direct reads (O_DIRECT, past the page cache) against a real RocksDB: which mode a store's open
table files are in is read from the kernel (/proc/self/fdinfo), not from the code under test."""

import logging
import os
import subprocess

import numpy as np
import pytest

from offgraph.store import StoreConfig, get_codec, open_store
from offgraph.store.prefetch import decide, store_reads_direct

D = 8
N = 3000


def sst_fd_direct(store_dir) -> dict[str, bool]:
    """Every open .sst file of the store in this process -> whether its descriptor has O_DIRECT."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = next(line.split()[1] for line in f if line.startswith("flags:"))
        except (OSError, StopIteration):  # closed meanwhile
            continue
        if target.endswith(".sst") and target.startswith(str(store_dir)):
            out[target] = bool(int(flags, 8) & os.O_DIRECT)  # 0o40000 on x86-64
    return out


def write_store(path, **cfg) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    v = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.standard_normal(N).astype(np.float32)
    with open_store(path, StoreConfig(dim=D, shards=2, **cfg), mode="w") as st:
        st.write(3, np.arange(N), v, w)
        st.flush()
    return v, w


@pytest.fixture
def ramfs(tmp_path):
    """A ramfs mount (it refuses O_DIRECT; tmpfs takes it since Linux 6.6). Root only."""
    d = tmp_path / "ramfs"
    d.mkdir()
    p = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(d)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a ramfs here (needs root): {p.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.parametrize("mode", ["r", "follow"])
def test_a_serving_store_reads_its_table_files_with_o_direct(tmp_path, mode):
    write_store(tmp_path / "s")
    with open_store(tmp_path / "s", mode=mode) as st:
        st.read(3, np.arange(0, N, 7))
        assert st.io_mode == "direct" and st.stats()["io_mode"] == "direct"
        files = sst_fd_direct(tmp_path / "s")
        assert files and all(files.values()), files
    assert store_reads_direct(tmp_path / "s")


def test_buffered_is_a_setting_and_reads_the_same_values(tmp_path):
    v, w = write_store(tmp_path / "s")
    rows = np.random.default_rng(1).integers(0, N + 50, 500)  # some absent
    got = {}
    for direct in (True, False):
        cfg = StoreConfig(dim=D, shards=2, direct_reads=direct)
        with open_store(tmp_path / "s", cfg, mode="r") as st:
            got[direct] = st.read_unique(3, rows) + st.read_unique_records(3, rows)
            files = sst_fd_direct(tmp_path / "s")
            assert files and all(x == direct for x in files.values()), files
            assert st.io_mode == ("direct" if direct else "buffered")
    for a, b in zip(got[True], got[False]):
        assert np.array_equal(a, b)
    vec, first, found = got[True][:3]
    assert np.array_equal(found, rows < N)
    assert np.array_equal(vec[found], v[rows[found]]) and np.array_equal(first[found], w[rows[found]])
    assert np.array_equal(got[True][3][found], get_codec("fp32", D).encode(v, w)[rows[found]])


def test_a_filesystem_that_refuses_o_direct_is_read_buffered_with_one_warning(ramfs, caplog):
    path = ramfs / "s"
    with caplog.at_level(logging.WARNING, logger="offgraph.store"):
        v, w = write_store(path)  # the writer's flushes too: RocksDB would refuse to open with direct I/O
        caplog.clear()
        with open_store(path, mode="r") as st:
            assert st.io_mode == "buffered" and st.stats()["io_mode"] == "buffered"
            vec, first = st.read(3, np.arange(N))
            assert np.array_equal(vec, v) and np.array_equal(first, w)
            assert sst_fd_direct(path) and not any(sst_fd_direct(path).values())
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path) in warnings[0] and "O_DIRECT" in warnings[0], warnings
    assert not store_reads_direct(path)


def test_auto_prefetch_is_off_for_a_direct_store():
    go, why = decide("auto", 1 << 20, available=64 << 30, direct=True)
    assert go is False and "direct" in why
    assert decide("auto", 1 << 20, available=64 << 30, direct=False)[0] is True
    assert decide("on", 1 << 20, available=64 << 30, direct=True)[0] is True


def test_a_server_with_store_io_buffered_reads_its_version_store_through_the_page_cache(tmp_path):
    """``offgraph serve --store-io buffered`` (a machine whose RAM holds the stores): the version's store
    opens without O_DIRECT whatever it records, and the default reads direct; the flag is checked by name."""
    from offgraph.modeldir.manifest import STORE_DIR, open_version_store
    from offgraph.server.config import ServerConfig

    write_store(tmp_path / STORE_DIR)
    manifest = {"store": StoreConfig(dim=D, shards=2).to_dict()}
    for direct, want in ((None, True), (False, False), (True, True)):
        with open_version_store(tmp_path, manifest, "r", direct_reads=direct) as st:
            st.read(3, np.arange(0, N, 7))
            fds = sst_fd_direct(tmp_path / STORE_DIR)
            assert fds and all(v is want for v in fds.values()), (direct, fds)
            assert st.io_mode == ("direct" if want else "buffered")
    assert ServerConfig(models_dir=tmp_path).store_io == "direct"
    assert ServerConfig(models_dir=tmp_path, store_io="buffered").store_io == "buffered"
    with pytest.raises(ValueError, match="--store-io"):
        ServerConfig(models_dir=tmp_path, store_io="mmap")
