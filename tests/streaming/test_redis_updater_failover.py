"""The updater on the Redis backend through a master's death, where the write's first call to the dead master
is a READ (the stored seqs of rows at or below the shard's watermark: ``EmbeddingStore._fresh``), which fails as
``StoreUnavailable`` rather than the ``StoreRemoteError`` of a failed write script. The updater must treat
both alike: log, drop the gathered batch, reopen after a backoff, and go on (issue 48: it exited rc 1 with a
traceback). Real parts: a Redis Cluster of 3 masters and 3 replicas, a spool, the in-process Updater."""

import json
import threading

import numpy as np
import pytest
from polling import wait_for
from redis_helpers import cluster  # noqa: F401 (the module's fixture)
from streaming_helpers import NAME, assert_store_holds, make_deltas, publish, spool_files, train_tiny, updater

from offgraph.export.export import export_run
from offgraph.store.redis_store import shard_key

SHARDS = 6


@pytest.fixture(scope="module")
def redis_version(tmp_path_factory, cluster):  # noqa: F811
    root = tmp_path_factory.mktemp("redis-failover")
    vdir = root / "models" / NAME / "1"
    export_run(train_tiny(root), vdir, shards=SHARDS, quant="fp32", progress=False, backend=cluster.url)
    return vdir


def _running_updater(models, spool):
    """An in-process updater running in a thread; ``outcome`` gets its summary, or the error it ended with."""
    up = updater(models, spool)
    up.start()
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = up.run()
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    return up, worker, outcome


@pytest.mark.timeout(240)
def test_a_master_killed_under_a_stale_read_is_reopened_not_an_exit(cluster, redis_version, tmp_path):  # noqa: F811
    models, spool = redis_version.parent.parent, tmp_path / "spool"
    namespace = json.loads((redis_version / "store" / "store.json").read_text())["config"]["namespace"]
    rng = np.random.default_rng(3)
    first = make_deltas(rng, 3000, seq0=10_000)
    publish(spool, 1, first)
    up, worker, outcome = _running_updater(models, spool)
    try:
        wait_for(lambda: not spool_files(spool) or "error" in outcome, 60, what="the first file applied")
        assert "error" not in outcome, outcome
        # every seq of the next file is at or below what shard 0 holds: its write begins by reading the
        # stored seqs there, from a master that is now dead
        dead = cluster.master_of(shard_key(namespace, 0))
        cluster.kill(dead)
        stale = make_deltas(rng, 3000, seq0=1)
        newer = make_deltas(rng, 3000, seq0=50_000)
        publish(spool, 1, stale)
        publish(spool, 1, newer)
        cluster.wait_failover(shard_key(namespace, 0), dead)
        wait_for(lambda: not spool_files(spool) or "error" in outcome, 120, what="the spool drained after the failover")
        assert "error" not in outcome, f"the updater exited: {outcome['error']!r}"
        assert worker.is_alive()
    finally:
        up.stop()
        worker.join(30)
        if dead.proc is None or dead.proc.poll() is not None:
            cluster.start(dead)  # back, as a replica: the module's other tests see a whole cluster
    assert "error" not in outcome, f"the updater exited: {outcome['error']!r}"
    assert up.metrics.store_reopens >= 1 and outcome["summary"]["store_reopens"] == up.metrics.store_reopens
    assert_store_holds(redis_version, [first, stale, newer])


@pytest.mark.timeout(240)
def test_a_spool_file_is_deleted_only_once_a_replica_holds_its_rows(cluster, redis_version, tmp_path):  # noqa: F811
    """The spool forgets what it acknowledged (an applied file is deleted), so an applied file must survive
    the master's death: with shard 0's replica stopped and its link cut, the updater's writes there are
    applied by the master alone and confirmed by no replica; the file must stay in the spool until a
    replica holds it. Then the master is killed -9, the stale replica promoted, and the store must end
    holding every row (before ``WAIT``, the file was gone and its rows with the master)."""
    models, spool = redis_version.parent.parent, tmp_path / "spool"
    namespace = json.loads((redis_version / "store" / "store.json").read_text())["config"]["namespace"]
    rng = np.random.default_rng(5)
    base = make_deltas(rng, 2000, seq0=100_000)
    publish(spool, 1, base)
    up, worker, outcome = _running_updater(models, spool)
    master = cluster.master_of(shard_key(namespace, 0))
    (replica,) = cluster.replicas_of(master)
    try:
        wait_for(lambda: not spool_files(spool) or "error" in outcome, 60, what="the first file applied")
        cluster.pause(replica)
        cluster.cut_replication(master)
        try:
            unconfirmed = make_deltas(rng, 2000, seq0=200_000)
            publish(spool, 1, unconfirmed)
            wait_for(lambda: up.metrics.store_reopens >= 1 or "error" in outcome, 60, what="an unconfirmed write")
            assert spool_files(spool), "the file was deleted though no replica held its rows"
            cluster.kill(master)
        finally:
            cluster.resume(replica)
        cluster.wait_failover(shard_key(namespace, 0), master)
        wait_for(lambda: not spool_files(spool) or "error" in outcome, 120, what="the spool drained after the failover")
        assert "error" not in outcome, f"the updater exited: {outcome['error']!r}"
    finally:
        up.stop()
        worker.join(30)
        if master.proc is None or master.proc.poll() is not None:
            cluster.start(master)
    assert "error" not in outcome, f"the updater exited: {outcome['error']!r}"
    assert_store_holds(redis_version, [base, unconfirmed])
