"""`offgraph synth`: the spec's table sizes, its settings' refusals, determinism by seed, a servable version."""

from __future__ import annotations

import json

import numpy as np
import pytest

import offgraph.cli
from offgraph.cli.synth import count
from offgraph.export.synth import CHUNK_ROWS, synth_version, table_chunks
from offgraph.export.synth_config import SynthConfig
from offgraph.export.synth_spec import HUGE_TABLES, MIN_TOTAL_ROWS, SMALL_TABLES, huge_table_rows, synth_spec
from offgraph.export.traffic import build_requests
from offgraph.features.spec import parse_spec
from offgraph.store import open_store

ROWS = 60_000


@pytest.mark.parametrize("total", [MIN_TOTAL_ROWS, 10**6, 10**9 + 7, 2 * 10**8])
def test_tables_add_up_to_the_rows_asked(total):
    spec = parse_spec(synth_spec(total), source="test")
    rows = {f.name: f.rows for f in spec.fields}
    assert sum(rows.values()) == total
    assert len(spec.fields) == len(HUGE_TABLES) + len(SMALL_TABLES)
    for name, _, _op, n, _ in SMALL_TABLES:  # small tables keep their cardinality whatever the size
        assert rows[name] == n
    huge = huge_table_rows(total)
    assert all(rows[name] == huge[name] >= 1024 for name, _, _ in HUGE_TABLES)
    if total >= 10**8:  # most rows in the few huge tables
        assert rows["user_id"] > rows["item_id"] > rows["author_id"] > rows["item_tags"] > 10**6


def test_settings_refuse_bad_values_with_clear_errors():
    with pytest.raises(ValueError, match=f"at least {MIN_TOTAL_ROWS:,} rows"):
        SynthConfig(rows=1000)
    with pytest.raises(ValueError, match=r"SynthConfig.quant \(--quant\)"):
        SynthConfig(rows=10**6, quant="int4")
    with pytest.raises(ValueError, match=r"SynthConfig.shards \(--shards\) must be greater than or equal to 1"):
        SynthConfig(rows=10**6, shards=0)
    with pytest.raises(ValueError, match=r"SynthConfig.seed \(--seed\)"):
        SynthConfig(rows=10**6, seed=-1)
    assert count("1e9") == 10**9 and count("2_000") == 2000 and count("123") == 123
    for bad in ("1.5e6", "abc", "-5", ""):
        with pytest.raises(Exception, match="is not a row count"):
            count(bad)


def test_cli_refuses_bad_args(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        offgraph.cli.main(["synth", "--out", str(tmp_path / "m" / "1"), "--rows", "lots"])
    assert e.value.code == 2 and "'lots' is not a row count" in capsys.readouterr().err
    assert offgraph.cli.main(["synth", "--out", str(tmp_path / "m" / "1"), "--rows", "100"]) == 2
    assert f"at least {MIN_TOTAL_ROWS:,} rows" in capsys.readouterr().err
    assert offgraph.cli.main(["synth", "--out", str(tmp_path / "m" / "x"), "--rows", "1e5"]) == 2
    assert "--out must end in an integer version directory" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_chunks_are_seeded_per_table_and_chunk():
    a = list(table_chunks(3, 5, CHUNK_ROWS + 10, 4))
    b = list(table_chunks(3, 5, CHUNK_ROWS + 10, 4))
    c = list(table_chunks(4, 5, CHUNK_ROWS + 10, 4))
    assert [len(x[0]) for x in a] == [CHUNK_ROWS, 10] and a[1][0][0] == CHUNK_ROWS
    assert all(np.array_equal(x[1], y[1]) and np.array_equal(x[2], y[2]) for x, y in zip(a, b))
    assert not np.array_equal(a[0][1], c[0][1])
    # one table's rows do not depend on the table before it (each chunk has its own seed)
    assert not np.array_equal(next(table_chunks(3, 6, 10, 4))[1], a[0][1][:10])


def test_same_seed_same_model_and_it_scores(tmp_path):
    from offgraph.scoring.scorer import load  # TensorFlow: imported by the tests that score only

    cfg = SynthConfig(rows=ROWS, seed=7, shards=2)
    ma = synth_version(tmp_path / "a" / "scale" / "1", cfg, progress=False)
    mb = synth_version(tmp_path / "b" / "scale" / "1", cfg, progress=False)
    mc = synth_version(tmp_path / "c" / "scale" / "1", cfg.replace(seed=8), progress=False)
    want = {f["name"]: f["rows"] for f in synth_spec(ROWS)["fields"]}
    assert ma["store"]["row_counts"] == want and sum(want.values()) == ROWS
    assert ma["training"]["synthetic"]["seed"] == 7 and mc["training"]["synthetic"]["seed"] == 8
    assert ma["spec"] == mb["spec"] == mc["spec"]
    with open_store(tmp_path / "a" / "scale" / "1" / "store", mode="r") as st:
        per_table = st.stats(exact=True)["rows_per_table"]
    assert per_table == {i: want[f["name"]] for i, f in enumerate(ma["fields"])}
    reqs = build_requests(ROWS, 3, 50, "zipf", seed=1)
    scores = {}
    for k in "abc":
        with load(tmp_path / k / "scale") as sc:
            scores[k] = np.stack([sc.score(r, c) for r, c in reqs])
            v, w = sc.store.read(0, np.arange(0, want["user_id"], 997))
            scores[k + "_rows"] = np.concatenate([v.ravel(), w])
    assert np.array_equal(scores["a"], scores["b"]) and np.array_equal(scores["a_rows"], scores["b_rows"])
    assert not np.array_equal(scores["a_rows"], scores["c_rows"])
    assert not np.allclose(scores["a"], scores["c"])
    assert np.isfinite(scores["a"]).all() and 0.05 < scores["a"].mean() < 0.95
    # refuses to write over a complete version
    with pytest.raises(ValueError, match="already a complete version"):
        synth_version(tmp_path / "a" / "scale" / "1", cfg, progress=False)
    assert json.loads((tmp_path / "a" / "scale" / "1" / "manifest.json").read_text())["created_at"] == ma["created_at"]


def test_hot_set_from_a_synthetic_training_log(tmp_path):
    """`--hot-set-data`: the rows a log of the bench's own kind of traffic looks up most, hottest first; the
    most popular user (Zipf rank 0: raw id 0) is among them."""
    from bench.hot_set_seed import write_training_log
    from offgraph.features.fg import FeatureGenerator
    from offgraph.modeldir.hot_set import read_hot_set

    log = tmp_path / "log.parquet"
    write_training_log(log, ROWS, 3000, seed=11)
    m = synth_version(
        tmp_path / "m" / "scale" / "1",
        SynthConfig(rows=ROWS, shards=2, hot_set_data=str(log), hot_set_rows=500),
        progress=False,
    )
    assert m.hot_set is not None and m.hot_set.rows == 500 and m.hot_set.source.startswith(str(log))
    tables, rows = read_hot_set(tmp_path / "m" / "scale" / "1", m)
    spec = parse_spec(synth_spec(ROWS))
    user = [i for i, f in enumerate(spec.fields) if f.name == "user_id"][0]
    fg = FeatureGenerator(spec)
    row0 = int(fg.transform_columns({"user_id": [0]}, 1, dense=False).fields[user].ids[0])
    assert (user, row0) in set(zip(tables.tolist(), rows.tolist()))
    with pytest.raises(ValueError, match=r"SynthConfig.hot_set_rows \(--hot-set-rows\)"):
        SynthConfig(rows=ROWS, hot_set_rows=-1)
