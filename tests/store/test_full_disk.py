"""A full or read-only disk under `offgraph update`: every run exits
within seconds with rc 2 and one line naming the path and the errno, SIGTERM ends the process
in bounded time in any phase, and once space is freed every spool file is applied exactly once.
Real tmpfs mounts (root only), real RocksDB, `offgraph update` as a subprocess.

OFFGRAPH_FULL_DISK_ROUNDS=N repeats the 10 full-disk runs N times (default 1: about a minute)."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streaming_helpers import (
    NAME,
    REPO,
    assert_store_holds,
    export_tiny,
    install_version,
    make_deltas,
    mount_tmpfs,
    open_version_store,
    publish,
    spool_files,
    train_tiny,
    update_cmd,
)

ROUNDS = int(os.environ.get("OFFGRAPH_FULL_DISK_ROUNDS", "1"))
EXIT_S = 10.0  # every run on a full disk, and every SIGTERM, ends the process within this
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    root = tmp_path_factory.mktemp("full-disk")
    return export_tiny(train_tiny(root), root / "fp32" / NAME / "1", "fp32")


@pytest.fixture
def disks(tmp_path, monkeypatch):
    """(disk, shm): a 24 MB tmpfs for the models and a 128 MB one for the write feed (its epoch
    files are not what fills up here); unmounted after, even on failure."""
    from offgraph.store.feed import SHM_ENV

    disk, shm = tmp_path / "disk", tmp_path / "shm"
    mount_tmpfs(disk, "24m")
    try:
        mount_tmpfs(shm, "128m")
        monkeypatch.setenv(SHM_ENV, str(shm))
        ENV[SHM_ENV] = str(shm)
        yield disk, shm
    finally:
        ENV.pop(SHM_ENV, None)
        for d in (disk, shm):
            subprocess.run(["umount", "-l", str(d)], check=False)


def fill(disk, leave: int = 0):
    """Take the free space of ``disk`` but ``leave`` bytes (in shrinking chunks: a running
    updater may write meanwhile); returns the filler file."""
    filler = disk / "filler"
    with open(filler, "ab") as f:
        chunk = 1 << 20
        while chunk >= 4096:
            st = os.statvfs(disk)
            if st.f_bavail * st.f_frsize - leave < chunk:
                chunk //= 2
                continue
            try:
                os.posix_fallocate(f.fileno(), os.fstat(f.fileno()).st_size, chunk)
            except OSError:
                chunk //= 2
    return filler


def start(models, spool, *args):
    return subprocess.Popen(
        update_cmd(models, spool, *args), cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(p, t0: float, what: str) -> tuple[int, float, str]:
    """Wait at most EXIT_S from ``t0`` (a hang fails the test, it does not hang it)."""
    try:
        _, err = p.communicate(timeout=max(0.1, t0 + EXIT_S - time.monotonic()))
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"{what}: still running {EXIT_S:g}s later (killed): {err[-3000:]}")
    return p.returncode, time.monotonic() - t0, err


def assert_clear_disk_error(rc: int, err: str, where) -> None:
    assert rc == 2, f"rc {rc}: {err[-3000:]}"
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("offgraph update: error: [Errno 28]") and f"{where}" in last, err[-3000:]


def wait_for(p, words: str, timeout: float = 30.0) -> list[str]:
    """stderr lines of ``p`` up to the first holding ``words`` (bounded)."""
    lines, t_end = [], time.monotonic() + timeout
    while time.monotonic() < t_end:
        line = p.stderr.readline()
        if not line:
            break
        lines.append(line)
        if words in line:
            return lines
    p.kill()
    pytest.fail(f"no line with {words!r} within {timeout:g}s: {''.join(lines)[-3000:]}")


def partial_write(vdir, spool, shards: list[int]) -> str:
    """What a crash between the shard batches of one write leaves: the first spool file written,
    with its position, to ``shards`` only; returns its name."""
    from offgraph.streaming.deltas import read as read_delta_file
    from offgraph.streaming.sources import SPOOL_POSITION_KEY
    from offgraph.streaming.updater import shard_subset

    name = spool_files(spool)[0]
    b = read_delta_file(spool / name)
    with open_version_store(vdir, "w") as st:
        for s, idx in shard_subset(b, st.config.shards, shards).items():
            st.write(
                b.table_ids[idx],
                b.rows[idx],
                b.vectors[idx],
                b.first_order[idx],
                seqs=b.seqs[idx],
                meta={SPOOL_POSITION_KEY: name.encode()},
                meta_shards=s,
            )
    return name


def pile_up_l0(vdir, deltas: list, rng, seq0: int, files: int = 19) -> int:
    """Write small flushed batches with compactions off until a shard holds ``files`` L0 files
    (RocksDB slows writes down at 20: a flush then waits for a compaction); appends the deltas
    to ``deltas``, returns the next seq."""
    with open_version_store(vdir, "w") as st:
        for db in st.storage._dbs:
            db.set_options({"disable_auto_compactions": "true"})
        for _ in range(files):
            if max(int(db.property_value("rocksdb.num-files-at-level0")) for db in st.storage._dbs) >= files:
                break
            d = make_deltas(rng, 200, seq0=seq0)
            seq0 += 200
            st.write(d["table_ids"], d["rows"], d["vectors"], d["first_order"], seqs=d["seqs"], durability="flush")
            deltas.append(d)
    return seq0


# --------------------------------------------------------------------------- acceptance
def test_full_disk_runs_exit_rc2_in_seconds_and_lose_nothing(export, disks, tmp_path):
    """10 runs of `offgraph update` on a full tmpfs, filled before the start, mid-stream and during
    the re-apply after a crash between shard batches: each exits with rc 2 within 10 s, naming
    the store and ENOSPC (before: 5 of 6 hung, in a flush or a close waiting for a compaction that
    cannot run on a full disk). Then, with space again, every spool file is applied exactly once."""
    disk, _ = disks
    models, spool = disk / "models", tmp_path / "spool"
    vdir = install_version(export, models, 1)
    store = vdir / "store"
    rng = np.random.default_rng(26)
    deltas, names = [], []
    seq = 1

    def add(k: int):
        nonlocal seq
        d = make_deltas(rng, k, seq0=seq)
        seq += k
        deltas.append(d)
        names.append(publish(spool, 1, d).name)

    runs = []  # (phase, rc, seconds)
    reapplied = 0  # re-apply runs that got as far as the re-apply (not stopped by the disk at the store's open)
    for _ in range(ROUNDS):
        # before the start: the disk full, or room to open the store but not to write much
        for leave in (0, 64 << 10, 300 << 10):
            for _ in range(5):
                add(500)
            filler = fill(disk, leave)
            rc, dt, err = finish(start(models, spool, "--once"), time.monotonic(), f"full before start ({leave})")
            assert_clear_disk_error(rc, err, store)
            runs.append(("before", rc, dt))
            filler.unlink()
        # mid-stream: files keep coming while the disk fills up under the running updater
        # (small files with room left for their flushes but not for a compaction: what hung before)
        for k, leave in ((50, 300 << 10), (50, 1 << 20), (500, 300 << 10), (5000, 0)):
            p = start(models, spool)
            wait_for(p, "recorded positions")
            t_fill, n0 = None, len(names)
            t_end = time.monotonic() + 60
            while p.poll() is None and time.monotonic() < t_end:
                add(k)
                if t_fill is None and len(names) >= n0 + 20:
                    t_fill = time.monotonic()
                if t_fill is not None:
                    fill(disk, leave)  # and kept full: RocksDB frees what a compaction made obsolete
                time.sleep(0.01)
            if t_fill is None:
                p.kill()
                pytest.fail(f"the updater never caught up with the stream: rc {p.wait()}: {p.communicate()[1][-3000:]}")
            rc, dt, err = finish(p, t_fill, f"full mid-stream (k={k}, {leave >> 10} KiB left)")
            assert_clear_disk_error(rc, err, store)
            runs.append((f"mid-stream k={k} leave={leave >> 10}K", rc, dt))
            (disk / "filler").unlink()
        # the re-apply after a crash between the shard batches of one write
        # (the first two with a shard one L0 file short of a write slowdown: its flush waits for a
        # compaction that the full disk stops)
        for shards, leave, pile in (([0, 1, 2], 64 << 10, True), ([0], 64 << 10, True), ([1, 3], 0, False)):
            add(2000)
            if not spool_files(spool):
                add(2000)
            if pile:
                seq = pile_up_l0(vdir, deltas, rng, seq)
            partial_write(vdir, spool, shards)
            filler = fill(disk, leave)
            rc, dt, err = finish(start(models, spool, "--once"), time.monotonic(), f"re-apply to shards {shards}")
            assert_clear_disk_error(rc, err, store)
            runs.append((f"re-apply after {shards}", rc, dt))
            reapplied += "re-applying to shards" in err
            filler.unlink()
    print(
        "full-disk runs (phase, rc, seconds):", [(w, rc, round(dt, 2)) for w, rc, dt in runs], "re-applied:", reapplied
    )
    assert len(runs) == 10 * ROUNDS and all(rc == 2 and dt < EXIT_S for _, rc, dt in runs), runs
    assert reapplied >= ROUNDS, "no run on a full disk got as far as a re-apply"

    # space again: everything is applied, once
    p = subprocess.run(
        update_cmd(models, spool, "--once"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert spool_files(spool) == [] and spool_files(spool / "applied") == sorted(names)
    assert not (spool / "dead").exists() or not any((spool / "dead").iterdir())
    assert_store_holds(vdir, deltas)


def test_a_flush_that_waits_for_a_compaction_the_full_disk_stops_is_rc2(export, disks, tmp_path):
    """A shard one file short of RocksDB's L0 slowdown trigger, on a disk with room for a small
    flush but not for the compaction it needs: the flush waits for that compaction, which fails
    and is retried until space is freed. Before, the updater waited there for good (in
    ``Rdict.flush`` -> ``WaitUntilFlushWouldNotStallWrites``); now it exits with rc 2 naming the
    store, and applies the file once space is freed."""
    disk, _ = disks
    models, spool = disk / "models", tmp_path / "spool"
    vdir = install_version(export, models, 1)
    rng = np.random.default_rng(11)
    deltas = []
    pile_up_l0(vdir, deltas, rng, 1)
    with open_version_store(vdir) as st:
        l0 = [int(st.property_value(s, "rocksdb.num-files-at-level0")) for s in range(st.config.shards)]
    assert max(l0) == 19, l0
    deltas.append(make_deltas(rng, 200, seq0=10_000))
    name = publish(spool, 1, deltas[-1]).name
    filler = fill(disk, 64 << 10)
    t0 = time.monotonic()
    rc, dt, err = finish(start(models, spool, "--once"), t0, "a flush waiting for a compaction")
    assert_clear_disk_error(rc, err, vdir / "store")
    assert spool_files(spool) == [name]
    filler.unlink()
    p = subprocess.run(
        update_cmd(models, spool, "--once"), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0 and spool_files(spool / "applied") == [name], p.stderr[-3000:]
    assert_store_holds(vdir, deltas)


# --------------------------------------------------------------------------- SIGTERM
def test_sigterm_ends_the_updater_in_any_phase(export, disks, tmp_path):
    """SIGTERM at start-up, while the store opens, mid-apply, on a full disk and idle: the
    process ends within 10 s each time (an orderly stop: rc 0, or the full disk's rc 2). Before,
    on the full disk it waited for good in a flush, where Python's signal handler never ran."""
    disk, _ = disks
    models, spool = disk / "models", tmp_path / "spool"
    vdir = install_version(export, models, 1)
    rng = np.random.default_rng(3)
    seq = 1

    def add(n: int, k: int):
        nonlocal seq
        for _ in range(n):
            publish(spool, 1, make_deltas(rng, k, seq0=seq))
            seq += k

    from offgraph.streaming.stop_watchdog import EXIT_STOP_TIMEOUT

    def term(p, what: str, ok=(0,)):
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        rc, dt, err = finish(p, t0, what)
        # (or the watchdog's status: the orderly stop took longer than its grace time)
        assert rc in ok or rc in (EXIT_STOP_TIMEOUT, -signal.SIGTERM), f"{what}: rc {rc}: {err[-3000:]}"
        assert "Traceback" not in err, err[-3000:]
        return dt

    times = {}
    times["start-up"] = term(start(models, spool), "start-up")
    p = start(models, spool)
    wait_for(p, "live version of")  # the store has just opened
    times["store open"] = term(p, "store open")
    add(200, 5000)
    p = start(models, spool, "--batch-files", "1")
    wait_for(p, "recorded positions")
    time.sleep(0.5)
    times["mid-apply"] = term(p, "mid-apply")
    assert spool_files(spool), "the stream was drained before the SIGTERM: not mid-apply"
    seq = pile_up_l0(vdir, [], rng, seq)  # the next flush waits for a compaction the full disk stops
    p = start(models, spool)
    wait_for(p, "recorded positions")
    filler = fill(disk, 64 << 10)
    add(1, 200)
    time.sleep(1.0)
    times["full disk"] = term(p, "full disk", ok=(0, 2))
    filler.unlink()
    p = start(models, spool)
    wait_for(p, "recorded positions")
    time.sleep(2.0)  # drained (or refused by the disk): waiting for files
    times["idle"] = term(p, "idle", ok=(0, 2))
    print("SIGTERM -> exit (s):", {k: round(v, 2) for k, v in times.items()})


def test_stop_watchdog_exits_when_the_orderly_stop_hangs(tmp_path):
    """A main thread that never comes back (here a sleep; in the field a RocksDB flush that
    waited for good) cannot take a signal: the watchdog thread does, logs one line and exits
    with EXIT_STOP_TIMEOUT once the grace time is over."""
    code = (
        "import logging, sys, time; logging.basicConfig()\n"
        "from offgraph.streaming.stop_watchdog import StopWatchdog\n"
        "w = StopWatchdog(grace_s=1.0); w.on_stop(lambda: None)\n"
        "print('ready', flush=True); time.sleep(120)\n"
    )
    from offgraph.streaming.stop_watchdog import EXIT_STOP_TIMEOUT

    p = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    rc, dt, err = finish(p, t0, "a stop that hangs")
    assert rc == EXIT_STOP_TIMEOUT and 0.9 < dt < 5, (rc, dt, err)
    assert "did not finish within 1s" in err and "Traceback" not in err, err


# --------------------------------------------------------------------------- item 11: read-only
def test_read_only_models_dir_is_rc2_and_one_line(export, tmp_path):
    """A models directory on a read-only mount: `offgraph update`, `offgraph export --out` and
    `offgraph features load` each exit with rc 2 and one line naming the path and EROFS (before:
    update gave rc 1 and a RuntimeError traceback)."""
    ro = tmp_path / "ro"
    mount_tmpfs(ro, "16m")
    try:
        models = ro / "models"
        install_version(export, models, 1)
        assert subprocess.run(["mount", "-o", "remount,ro", str(ro)]).returncode == 0
        spool = tmp_path / "spool"
        spool.mkdir()
        movies = tmp_path / "movies.parquet"
        pq.write_table(
            pa.table(
                {
                    "movie_id": [1, 2],
                    "genres": [["Drama"], ["Comedy"]],
                    "title_words": [["a"], ["b"]],
                    "release_year": [1990, 1991],
                }
            ),
            movies,
        )
        cli = [sys.executable, "-m", "offgraph.cli"]
        commands = {
            "update": update_cmd(models, spool, "--once"),
            "export": [
                *cli,
                "export",
                "--run",
                str(export.parents[2] / "run"),
                "--out",
                str(models / NAME / "2"),
                "--no-progress",
            ],
            "features load": [
                *cli,
                "features",
                "load",
                "--model",
                str(models / NAME),
                "--spec",
                str(REPO / "examples" / "movielens.yaml"),
                "--table",
                "item",
                "--data",
                str(movies),
                "--no-progress",
            ],
        }
        for what, cmd in commands.items():
            p = subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
            lines = p.stderr.strip().splitlines()
            assert p.returncode == 2 and "Traceback" not in p.stderr, f"{what}: rc {p.returncode}: {p.stderr[-3000:]}"
            assert lines[-1].startswith(f"offgraph {what}: error: [Errno 30]") and str(models) in lines[-1], (
                f"{what}: {p.stderr[-3000:]}"
            )
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
