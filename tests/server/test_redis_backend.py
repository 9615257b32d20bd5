"""A version whose rows live in a real Redis Cluster (`offgraph export --backend redis://...`): its scores
equal the RocksDB export's of the same run exactly (fp32 and int8), a server serves it and shows where its
rows live, a cluster that goes down gets 503s with Retry-After within the timeout (the version stays
healthy), and the server serves again by itself when the cluster is back."""

import json
import time

import httpx
import numpy as np
import pytest
from redis_helpers import cluster  # noqa: F401 (the module's fixture)
from server_helpers import ThreadServer, score, server_config, wait_for

from offgraph.export.export import export_run
from offgraph.scoring.scorer import Scorer
from offgraph.store import open_store


@pytest.fixture(scope="module")
def exports(tiny_model, cluster, tmp_path_factory):  # noqa: F811
    """MODELS dirs of the tiny run exported twice per quant: RocksDB and redis."""
    run = tiny_model[0].parent / "run"
    root = tmp_path_factory.mktemp("redis-exports")
    out = {}
    for quant in ("fp32", "int8"):
        for backend in ("rocksdb", cluster.url):
            kind = "redis" if backend != "rocksdb" else "rocksdb"
            models = root / f"{kind}-{quant}"
            export_run(run, models / "ml" / "1", shards=6, quant=quant, progress=False, backend=backend)
            out[kind, quant] = models
    return out


@pytest.mark.parametrize("quant", ["fp32", "int8"])
def test_scores_equal_the_rocksdb_backends_exactly(exports, requests_, quant):
    with (
        Scorer(exports["rocksdb", quant] / "ml" / "1") as local,
        Scorer(exports["redis", quant] / "ml" / "1") as remote,
    ):
        assert remote.store.backend == "redis" and local.store.backend == "rocksdb"
        for req, cands in requests_[:20]:
            np.testing.assert_array_equal(remote.score(req, cands), local.score(req, cands))
        # the scores depend on the rows: a check that could tell a zero-row store apart
        req, cands = requests_[0]
        assert np.ptp(remote.score(req, cands)) > 0 or len(cands) == 1


def test_served_from_the_cluster_then_503_while_it_is_down_and_back_by_itself(exports, cluster, requests_):  # noqa: F811
    srv = ThreadServer(server_config(exports["redis", "int8"]))
    req, cands = requests_[0]
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            st = c.get("/v1/models/ml").json()
            assert st["loaded"]["backend"] == "redis"
            url, _, namespace = st["loaded"]["rows_at"].partition(" namespace ")
            assert namespace.startswith("ml/1/"), st["loaded"]
            # the export recorded every node as a seed, not only the one it was given
            assert sorted(url.removeprefix("redis://").split(",")) == sorted(n.address for n in cluster.nodes)
            with Scorer(exports["rocksdb", "int8"] / "ml" / "1") as local:
                want = local.score(req, cands)
            body = {"request": req, "candidates": cands}
            r = score(c, body)
            assert r.status_code == 200, r.text
            assert np.asarray(r.json()["scores"], np.float32).tolist() == want.astype(np.float32).tolist()

            # fresh candidates each time: rows the row cache holds would not need the cluster
            unseen = [[{**cand, "movie_id": 100_000 + i * 10 + j} for j, cand in enumerate(cands)] for i in range(50)]
            cluster.stop_all()
            try:
                t0 = time.monotonic()
                r = score(c, {"request": req, "candidates": unseen[0]})
                took = time.monotonic() - t0
                assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
                assert "did not answer" in r.json()["detail"] and took < 5.0, (took, r.text)
                assert c.get("/v1/models/ml").json()["loaded"]["version"] == 1  # healthy: nothing refused
                metrics = c.get("/metrics").text
                assert 'offgraph_store_unavailable_total{model="ml"}' in metrics
            finally:
                cluster.start_all()
            ok = wait_for(
                lambda: (lambda r: r if r.status_code == 200 else None)(
                    score(c, {"request": req, "candidates": unseen[1]})
                ),
                30,
                "a score after the cluster came back",
            )
            assert ok.json()["version"] == 1
    finally:
        srv.stop()


def test_two_servers_drop_a_written_row_from_their_caches_within_a_second(exports, requests_):
    """Two servers of one redis version (each its own row cache and change subscription) and a writer
    that writes no feed: every write of a table's rows reaches both servers' scores through the
    cluster's change stream alone; p99 of write -> both serve it, over 200 probes, under 1 s."""
    vdir = exports["redis", "fp32"] / "ml" / "1"
    manifest = json.loads((vdir / "manifest.json").read_text())
    field = manifest["fields"][0]  # every row of its table is rewritten: any request reads one of them
    rows = np.arange(field["rows"])
    req, cands = requests_[0]
    body = {"request": req, "candidates": cands[:3]}
    servers = [ThreadServer(server_config(exports["redis", "fp32"])) for _ in range(2)]
    rng = np.random.default_rng(3)
    took: list[float] = []
    try:
        clients = [httpx.Client(base_url=s.url, timeout=30) for s in servers]
        with open_store(vdir / "store", mode="w") as writer:
            before = [score(c, body).json()["scores"] for c in clients]  # now the rows are cached
            for probe in range(200):
                v = rng.normal(size=(len(rows), writer.config.dim)).astype(np.float32)
                w = rng.normal(size=len(rows)).astype(np.float32)
                t0 = time.perf_counter()
                writer.write(field["table_id"], rows, v, w, seqs=np.full(len(rows), 10**6 + probe))
                pending = set(range(2))
                while pending:
                    for i in list(pending):
                        got = score(clients[i], body).json()["scores"]
                        if got != before[i]:
                            before[i] = got
                            pending.discard(i)
                    assert time.perf_counter() - t0 < 10, f"probe {probe}: servers {pending} still serve the old row"
                took.append(time.perf_counter() - t0)
        for c in clients:
            assert "offgraph_store_changes_applied_total" in c.get("/metrics").text
            c.close()
    finally:
        for s in servers:
            s.stop()
    p50, p99 = np.percentile(took, 50), np.percentile(took, 99)
    print(f"redis change stream: write -> both servers serve it, p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms")
    assert p99 < 1.0, (p50, p99)
