"""The ``redis`` store backend against a real Redis Cluster (3 masters, 3 replicas on loopback): the same
calls give the same answers as the RocksDB backend, batches are atomic per shard with their meta, and a
cluster that does not answer is a StoreUnavailable within the timeout, after which reads recover."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from polling import wait_for
from redis.cluster import RedisCluster
from redis_helpers import cluster, redis_config  # noqa: F401 (cluster: the module's fixture)

from offgraph.store import StoreConfig, StoreUnavailable, open_store
from offgraph.store.internal_keys import WRITE_FENCE_KEY
from offgraph.store.keys import encode_keys, shard_of
from offgraph.store.open import backend_location
from offgraph.store.redis_store import RedisBackend, StoreFenced, connect, shard_key
from offgraph.store.store_file import write_store_file


def _data(n, dim=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, dim)).astype(np.float32), rng.normal(size=n).astype(np.float32)


def _both(tmp_path, cluster, name, **kw):  # noqa: F811
    """A RocksDB store and a redis store of the same layout, open for writing."""
    local = open_store(tmp_path / f"{name}-rocks", StoreConfig(**{"dim": 4, "shards": 6, **kw}), mode="w")
    remote = open_store(tmp_path / f"{name}-redis", redis_config(cluster, f"test/{name}", **kw), mode="w")
    return local, remote


@pytest.mark.parametrize("quant", ["fp32", "fp16", "int8"])
def test_same_calls_same_answers_as_rocksdb(tmp_path, cluster, quant):  # noqa: F811
    local, remote = _both(tmp_path, cluster, f"same-{quant}", quant=quant)
    v, w = _data(5000)
    try:
        for st in (local, remote):
            assert isinstance(st.storage, RedisBackend) == (st is remote)
            st.bulk_load_tables([(0, [(np.arange(3000), v[:3000], w[:3000])]), (3, [(np.arange(50), v[:50], w[:50])])])
            st.write(0, np.arange(100, 110), v[3000:3010], w[3000:3010], seqs=np.arange(10) + 5)
            st.write(0, [100, 101], v[4000:4002], w[4000:4002], seqs=[3, 99])  # 100: stale, 101: newer
            st.write([3, 3], [7, 7], v[4100:4102], w[4100:4102])  # duplicates in one call: the last wins
            st.write(0, np.arange(2), v[4200:4202], w[4200:4202], meta={b"offset": b"41"})
        tables = np.array([0, 0, 0, 0, 3, 3, 5])
        rows = np.array([0, 100, 101, 2999, 7, 49, 1])  # table 5: absent (zeros)
        a, b = local.read(tables, rows), remote.read(tables, rows)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert not b[0][-1].any()
        np.testing.assert_array_equal(
            local.row_seqs([0, 0, 0], [100, 101, 5]), remote.row_seqs([0, 0, 0], [100, 101, 5])
        )
        assert remote.row_seqs([0, 0], [100, 101]).tolist() == [5, 99]
        assert remote.get_meta_per_shard(b"offset") == local.get_meta_per_shard(b"offset") == [b"41"] * 6
        assert (
            remote.stats(exact=True)["rows_per_table"] == local.stats(exact=True)["rows_per_table"] == {0: 3000, 3: 50}
        )
        assert remote.verify_sample({0: 3000, 3: 50})["rows_read"] > 0
        # seeks (verify's): the first stored key at or after each bound, in every shard, as RocksDB finds it
        lowers = encode_keys(np.zeros(5, np.int64), np.array([0, 10, 500, 1500, 2500]))
        for s in range(6):
            assert remote.storage._seek_first(s, lowers) == local.storage._seek_first(s, lowers), s
    finally:
        local.close()
        remote.close()
    # a reader of the same namespace (another replica, another process) sees the same rows
    with open_store(tmp_path / f"same-{quant}-redis") as r:
        np.testing.assert_array_equal(r.read(tables, rows)[0], b[0])
        with pytest.raises(ValueError, match="read-only"):
            r.write(0, [0], v[:1], w[:1])


def test_a_batch_and_its_meta_are_one_transaction_on_one_slot(tmp_path, cluster):  # noqa: F811
    """Each shard is one hash whose braces name one slot: rows, seqs and positions of a batch go to one
    master in one MULTI/EXEC, whatever their number."""
    cfg = redis_config(cluster, "test/atomic", shards=6)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        v, w = _data(60_000)
        rows = np.arange(60_000)
        st.write(1, rows, v, w, seqs=rows, meta={b"offset": b"7"})  # > WRITE_PAIRS fields in some shards
        raw = connect(cluster.url, 2000)
        for s in range(6):
            n = int(raw.hlen(shard_key("test/atomic", s)))
            k = int(np.sum(shard_of(1, rows, 6) == s))
            assert n == 2 * k + 4, (s, n, k)  # a row and its seq each; the watermark, offset, marker, fence
        raw.close()
        np.testing.assert_array_equal(st.read(1, rows[-5:])[0], st.codec.decode(st.codec.encode(v[-5:], w[-5:]))[0])


def test_writes_chain_a_second_writer_or_a_lost_batch_is_fenced(tmp_path, cluster):  # noqa: F811
    """A batch applies only on what this writer's previous batch left in the shard: a second writer of the
    namespace, or a failover that lost acknowledged batches (simulated: the fence put back as it was),
    makes the next batch fail with nothing written."""
    cfg = redis_config(cluster, "test/fence", shards=2)
    v, w = _data(10)
    first = open_store(tmp_path / "s", cfg, mode="w")
    second = None
    try:
        first.write(1, np.arange(4), v[:4], w[:4], meta={b"offset": b"1"})
        second = open_store(tmp_path / "s", mode="w")  # reads the fences as the first left them
        second.write(1, np.arange(4), v[4:8], w[4:8], meta={b"offset": b"2"})
        with pytest.raises(StoreFenced, match="no longer holds this writer's last batch"):
            first.write(1, np.arange(4), v[:4], w[:4], meta={b"offset": b"3"})
        assert second.get_meta_per_shard(b"offset") == [b"2", b"2"]  # the refused batch wrote nothing
        np.testing.assert_array_equal(second.read(1, np.arange(4))[0], v[4:8])  # fp32: as written
        # a "lost" batch: the shards' fences back to what they held before second's last write
        raw = connect(cluster.url, 2000)
        before = [raw.hget(shard_key("test/fence", s), WRITE_FENCE_KEY) for s in range(2)]
        second.write(1, np.arange(4), v[6:10], w[6:10], meta={b"offset": b"4"})
        for s in range(2):
            raw.hset(shard_key("test/fence", s), WRITE_FENCE_KEY, before[s])
        raw.close()
        with pytest.raises(StoreFenced):
            second.write(1, np.arange(4), v[:4], w[:4], meta={b"offset": b"5"})
        # a writer that starts again takes the shards as they are
        second.close()
        second = open_store(tmp_path / "s", mode="w")
        second.write(1, np.arange(4), v[:4], w[:4], meta={b"offset": b"6"})
        assert second.get_meta_per_shard(b"offset") == [b"6", b"6"]
    finally:
        first.close()
        if second is not None:
            second.close()


def test_opening_errors_name_what_is_wrong(tmp_path, cluster):  # noqa: F811
    (tmp_path / "a").mkdir()
    write_store_file(str(tmp_path / "a"), redis_config(cluster, "test/never-written"))  # no row in the cluster
    with pytest.raises(ValueError, match="holds no shard 0 of namespace 'test/never-written'"):
        open_store(tmp_path / "a", mode="r")
    with open_store(tmp_path / "b", redis_config(cluster, "test/exists"), mode="w"):
        pass
    # a second namespace in a store of another layout: refused as RocksDB refuses a layout change
    with pytest.raises(ValueError, match="namespace"):
        open_store(tmp_path / "b", redis_config(cluster, "test/other"), mode="r")
    with pytest.raises(ValueError, match="needs StoreConfig.url"):
        open_store(tmp_path / "c", StoreConfig(dim=4, backend="redis"), mode="w")
    for bad in ("redis://", "redis://host", "redis://h:p", "mysql://h:1", "redis://h:1/x", "rocks", "redis://h:1,h"):
        with pytest.raises(ValueError, match="redis://HOST:PORT"):
            backend_location(bad)
    assert backend_location("redis://127.0.0.1:7000") == {"backend": "redis", "url": "redis://127.0.0.1:7000"}
    assert backend_location("redis://a:1,b:2")["url"] == "redis://a:1,b:2"  # several seeds
    with pytest.raises(OSError, match="cannot reach the Redis Cluster"):
        open_store(
            tmp_path / "d", StoreConfig(dim=4, backend="redis", url="redis://127.0.0.1:1", namespace="x"), mode="w"
        )


def test_a_cluster_down_is_unavailable_within_the_timeout_then_reads_recover(tmp_path, cluster):  # noqa: F811
    cfg = redis_config(cluster, "test/outage", remote_timeout_ms=300)
    v, w = _data(100)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(100), v, w)
        before = st.read(1, np.arange(100))[0]
        cluster.stop_all()
        try:
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailable) as e:
                st.read(1, np.arange(100))
            took = time.monotonic() - t0
            assert e.value.kind == "unavailable"
            assert took < 5.0, took  # bounded by the timeout (and one retry), never a hang
        finally:
            cluster.start_all()  # a whole-cluster restart: each node reads back its AOF
        # the same store object reads again by itself once the cluster answers
        got = None
        t_end = time.monotonic() + 30
        while got is None and time.monotonic() < t_end:
            try:
                got = st.read(1, np.arange(100))[0]
            except StoreUnavailable:
                time.sleep(0.2)
        assert got is not None, "reads did not recover after the cluster came back"
        np.testing.assert_array_equal(got, before)  # and nothing acknowledged was lost


def test_delete_rows_frees_the_namespace(tmp_path, cluster):  # noqa: F811
    cfg = redis_config(cluster, "test/delete")
    v, w = _data(1000)
    with open_store(tmp_path / "s", cfg, mode="w") as st:
        st.write(1, np.arange(1000), v, w)
        raw = connect(cluster.url, 2000)
        assert sum(raw.exists(shard_key("test/delete", s)) for s in range(6)) == 6
        assert st.delete_rows() == 6
        assert sum(raw.exists(shard_key("test/delete", s)) for s in range(6)) == 0
        raw.close()


def test_an_export_killed_midway_is_resumed_into_the_same_namespace(tmp_path, cluster):  # noqa: F811
    """`offgraph synth --backend redis://...` killed -9 during its bulk load, then run again: the second run
    takes the first's namespace (its rows are rewritten in place), the version completes and verifies, and
    the cluster holds no row of any other namespace of it."""
    out = tmp_path / "models" / "s" / "1"
    cmd = [sys.executable, "-m", "offgraph.cli", "synth", "--out", str(out), "--rows", "3e5", "--shards", "6"]
    cmd += ["--backend", cluster.url, "--no-progress"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    raw = connect(cluster.url, 2000)
    try:
        t_end = time.monotonic() + 120
        store_json = out / "store" / "store.json"
        while not (store_json.exists() and raw.dbsize() > 0 and _hlen_sum(raw, store_json) > 1000):
            assert proc.poll() is None and time.monotonic() < t_end, "the synth ended before it could be killed"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        first = json.loads(store_json.read_text())["config"]["namespace"]
        assert not (out / "manifest.json").exists()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        again = json.loads(store_json.read_text())["config"]["namespace"]
        assert again == first
        with open_store(out / "store", mode="r") as st:
            manifest = json.loads((out / "manifest.json").read_text())
            counts = {f["table_id"]: f["rows"] for f in manifest["fields"]}
            assert st.verify_sample(counts)["rows_read"] > 0
            assert sum(int(s["estimated_keys"]) for s in st.stats()["shards"]) >= sum(counts.values())
        # every key of the cluster that belongs to this version is one of its 6 shards
        keys = {k for k in raw.scan_iter(match=b"offgraph:{s/1/*", target_nodes=RedisCluster.ALL_NODES)}
        assert keys == {shard_key(first, s) for s in range(6)}, keys
    finally:
        if proc.poll() is None:
            proc.kill()
        raw.close()


def _hlen_sum(raw, store_json) -> int:
    """Fields the cluster holds so far of the store whose settings are ``store_json`` (0 while unreadable)."""
    try:
        ns = json.loads(store_json.read_text())["config"]["namespace"]
    except (OSError, ValueError, KeyError):
        return 0
    return sum(int(raw.hlen(shard_key(ns, s))) for s in range(6))


def test_a_one_row_write_on_any_node_reaches_a_watcher_at_once(tmp_path, cluster):  # noqa: F811
    """The change stream's latency must not depend on which node a shard's channel lives on: a write
    of one row publishes on one node only, and the watcher (one subscription per node) must not sit
    waiting on the other nodes' quiet connections before it reads that one."""
    cfg = redis_config(cluster, "test/watch-one")
    arrived: dict[int, float] = {}
    lost: list[float] = []
    with open_store(tmp_path / "s", cfg, mode="w") as writer:
        writer.write(1, np.arange(64), *_data(64))
        with open_store(tmp_path / "s", mode="r") as reader:

            def on_rows(tables, rows):
                for t, r in zip(tables.tolist(), rows.tolist()):
                    if t == 1:
                        arrived.setdefault(r, time.perf_counter())

            assert reader.watch_changes(on_rows, lambda: lost.append(time.perf_counter()))
            took = []
            nodes = set()
            for probe in range(36):  # rows cycle through every shard, so through every node's channels
                row = probe % 12
                arrived.pop(row, None)
                nodes.add(int(shard_of(np.array([1]), np.array([row]), 6)[0]))
                t0 = time.perf_counter()
                writer.write(1, np.array([row]), *_data(1, seed=probe))
                wait_for(lambda: row in arrived, 10, f"probe {probe}: the write of row {row} at the watcher", 0.001)
                took.append(arrived[row] - t0)
    assert nodes == set(range(6)), nodes  # the probes did cover every shard
    assert not lost, "the subscription was lost during the probes"
    p50, worst = np.percentile(took, 50), max(took)
    assert worst < 0.25, f"one-row write -> watcher: p50 {p50 * 1e3:.1f} ms, worst {worst * 1e3:.1f} ms"


def test_a_subscription_broken_under_the_watcher_forgets_the_cache_and_keeps_delivering(tmp_path, cluster):  # noqa: F811
    """A subscription's connections dropped on the client side (redis-py then reconnects and subscribes
    again by itself, on the next read): the watcher reports the gap (``on_lost``: what was published
    meanwhile is unknown) and later writes still reach it; the watcher thread never dies of it."""
    cfg = redis_config(cluster, "test/watch-broken")
    arrived: set[int] = set()
    lost: list[float] = []
    with open_store(tmp_path / "s", cfg, mode="w") as writer:
        writer.write(1, np.arange(12), *_data(12))
        with open_store(tmp_path / "s", mode="r") as reader:
            assert reader.watch_changes(lambda t, r: arrived.update(r.tolist()), lambda: lost.append(1.0))
            writer.write(1, np.array([0]), *_data(1))
            wait_for(lambda: 0 in arrived, 10, "row 0's write at the watcher")
            assert not lost
            for node_pubsub in list(reader.storage._subscription.node_pubsub_mapping.values()):
                node_pubsub.connection.disconnect()
            wait_for(lambda: lost, 10, "the broken subscription reported (else cached rows stay stale)")
            arrived.clear()
            for row in range(12):  # every shard
                writer.write(1, np.array([row]), *_data(1, seed=row))
            wait_for(lambda: len(arrived) >= 12, 10, "the writes of rows 0-11 at the watcher")
            assert arrived == set(range(12)), sorted(arrived)
            assert reader.storage._watcher is not None and reader.storage._watcher.is_alive()


def test_a_master_failover_under_the_watcher_is_a_gap_and_later_writes_still_arrive(tmp_path, cluster):  # noqa: F811
    """kill -9 of the master that holds a shard: its replica is promoted, redis-py moves that node's
    channels to it. The watcher reports the gap (``on_lost``), delivers later one-row writes on every
    shard, and does not spin on the dead node's connection meanwhile (its CPU stays small)."""
    cfg = redis_config(cluster, "test/watch-failover")
    arrived: set[int] = set()
    lost: list[int] = []
    with open_store(tmp_path / "s", cfg, mode="w") as writer:
        writer.write(1, np.arange(12), *_data(12))
        with open_store(tmp_path / "s", mode="r") as reader:
            assert reader.watch_changes(lambda t, r: arrived.update(r.tolist()), lambda: lost.append(1))
            seed = cluster.url.removeprefix("redis://")  # the store's url: kept alive, so a new writer can open
            key = next(
                k
                for k in (shard_key("test/watch-failover", s) for s in range(6))
                if cluster.master_of(k).address != seed
            )
            master = cluster.master_of(key)

            def replicated() -> bool:
                offset = int(cluster.info(master, "replication")["master_repl_offset"])
                replicas = cluster.replicas_of(master)  # a new cluster's gossip may not list it yet
                return bool(replicas) and all(
                    int(cluster.info(r, "replication").get("slave_repl_offset", -1)) >= offset for r in replicas
                )

            # the rows written so far replicated: a failover then loses none of them
            wait_for(replicated, 30, "a replica caught up with the master", 0.05)
            cpu0, wall0 = time.process_time(), time.monotonic()
            cluster.kill(master)
            try:
                cluster.wait_failover(key, master)
                wait_for(lambda: lost, 30, "the failover of a subscribed node reported")
                # this process's CPU (the watcher, this test's polls) while the node was down: a watcher
                # spinning on the dead connection would take the whole wall time
                spent, wall = time.process_time() - cpu0, time.monotonic() - wall0
                arrived.clear()
                pending = set(range(12))
                t_end = time.monotonic() + 60
                while pending and time.monotonic() < t_end:  # the writer may need a retry while the map settles
                    try:
                        writer.write(1, np.array(sorted(pending)), *_data(len(pending)))
                    except StoreUnavailable:
                        time.sleep(0.2)
                        continue
                    except StoreFenced:  # the failover lost its last batch (async replication): a new writer
                        writer.close()
                        writer = open_store(tmp_path / "s", mode="w")
                        continue
                    poll_end = time.monotonic() + 2
                    while not pending <= arrived and time.monotonic() < poll_end:
                        time.sleep(0.01)
                    pending -= arrived
                assert not pending, f"rows {sorted(pending)} written after the failover never reached the watcher"
            finally:
                cluster.start(master)  # back, as a replica of the new master
                cluster.wait_ok()
    assert spent < 0.3 * wall + 0.2, f"{spent:.2f} s of CPU over the {wall:.1f} s the node was down"
