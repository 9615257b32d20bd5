"""`offgraph prune` against a real Redis Cluster: old versions go, their rows in the cluster with them;
the newest, the pinned and the labelled ones stay and still read."""

import json

import numpy as np
from redis_helpers import cluster  # noqa: F401 (the module's fixture)

from offgraph.cli import main
from offgraph.export.synth import synth_version
from offgraph.export.synth_config import SynthConfig
from offgraph.store import open_store
from offgraph.store.redis_store import connect, shard_key


def _namespace(vdir) -> str:
    return json.loads((vdir / "store" / "store.json").read_text())["config"]["namespace"]


def test_prune_keeps_the_newest_pinned_and_labelled_and_deletes_the_rest(tmp_path, cluster, capsys):  # noqa: F811
    model = tmp_path / "models" / "s"
    backends = {1: cluster.url, 2: "rocksdb", 3: cluster.url, 4: cluster.url, 5: cluster.url}
    for v, b in backends.items():
        synth_version(model / str(v), SynthConfig(rows=300_000, shards=6, backend=b), progress=False)
    (model / "admin-policy.json").write_text(json.dumps({"policy": "pinned", "version": 1, "labels": {"canary": 3}}))
    ns = {v: _namespace(model / str(v)) for v, b in backends.items() if b != "rocksdb"}
    raw = connect(cluster.url, 2000)
    try:
        assert main(["prune", "--models", str(tmp_path / "models"), "--model", "s", "--keep", "1", "--dry-run"]) == 0
        assert "would prune 2 version(s) of s: [2, 4]" in capsys.readouterr().out
        assert all((model / str(v)).is_dir() for v in backends)
        assert main(["prune", "--models", str(tmp_path / "models"), "--model", "s", "--keep", "1"]) == 0
        assert "pruned 2 version(s) of s: [2, 4]" in capsys.readouterr().out
        assert sorted(p.name for p in model.iterdir() if p.is_dir()) == ["1", "3", "5"]
        assert sum(raw.exists(shard_key(ns[4], s)) for s in range(6)) == 0  # its rows left the cluster
        for v in (1, 3, 5):  # the kept ones still read
            assert sum(raw.exists(shard_key(ns[v], s)) for s in range(6)) == 6
            with open_store(model / str(v) / "store") as st:
                assert np.abs(st.read(np.zeros(4, np.int64), np.arange(4))[0]).sum() > 0
    finally:
        raw.close()
    assert main(["prune", "--models", str(tmp_path / "models"), "--model", "s", "--keep", "0"]) == 2
    assert "--keep must be an int >= 1" in capsys.readouterr().err
