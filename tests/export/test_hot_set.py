"""The static hot set: counting the rows training looks up, recording them in the version, seeding a server.

The expected counts come from another path than the one under test: ``encode_table``'s padded id and mask
arrays (what the Keras model trains on), counted with ``collections.Counter``.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from conftest import REPO

from offgraph.export.hot_set import KeyCounts, count_lookups
from offgraph.features import load_spec
from offgraph.features.tables import DataError
from offgraph.model.inputs import encode_table
from offgraph.modeldir.hot_set import read_hot_set, write_hot_set
from offgraph.modeldir.manifest_model import Manifest
from offgraph.store.keys import combine_keys


def _trained_lookups(spec, table) -> Counter:
    """(table id, row) -> times the rows of ``table`` look it up, from the model's own input arrays."""
    enc = encode_table(spec, table)
    out: Counter = Counter()
    for i in range(len(spec.fields)):
        ids, mask = enc.x[f"ids_{i}"], enc.x[f"mask_{i}"]
        out.update((i, int(r)) for r in ids[mask > 0])
    return out


def _expected_top(counts: Counter, limit: int) -> list[tuple[int, int, int]]:
    return sorted(((t, r, c) for (t, r), c in counts.items()), key=lambda x: (-x[2], x[0], x[1]))[:limit]


def test_key_counts_add_batches_and_rank_hottest_first_ties_by_key():
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 50, size=rng.integers(1, 400)).astype(np.uint64) for _ in range(40)]
    counts = KeyCounts()
    for b in batches:
        counts.add(combine_keys(2, b))
    plain = Counter(int(x) for b in batches for x in b)
    hot = counts.top(10, "test")
    want = sorted(plain.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    assert hot.rows.tolist() == [k for k, _ in want]
    assert hot.counts.tolist() == [c for _, c in want]
    assert set(hot.tables.tolist()) == {2}
    assert hot.lookups == sum(len(b) for b in batches)
    assert len(counts.top(1000, "test").rows) == len(plain)  # fewer distinct keys than asked: all of them
    with pytest.raises(ValueError, match="limit"):
        counts.top(-1, "test")


def test_count_lookups_counts_what_the_model_trains_on(movielens_table):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    table = movielens_table.slice(0, 3000)
    mask = np.zeros(table.num_rows, bool)
    mask[::3] = True  # only these rows count
    got = count_lookups(spec, table, mask, progress=False).top(200, "t")
    want_counts = _trained_lookups(spec, table.filter(mask))
    assert [(int(t), int(r), int(c)) for t, r, c in zip(got.tables, got.rows, got.counts)] == _expected_top(
        want_counts, 200
    )
    assert got.lookups == sum(want_counts.values())


def test_count_lookups_names_the_data_that_cannot_be_counted(movielens_table):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    with pytest.raises(DataError, match="no column 'genres'"):
        count_lookups(spec, movielens_table.slice(0, 10).drop(["genres"]), source="log.parquet", progress=False)


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _manifest(hot: dict | None) -> Manifest:
    return Manifest.from_json(  # strict types: from JSON, as a manifest is read
        json.dumps(
            {
                "format_version": 1,
                "fg_version": "x",
                "embedding_dim": 4,
                "fields": [{"name": "a", "table_id": 0, "rows": 10}, {"name": "b", "table_id": 1, "rows": 5}],
                "spec": {},
                "store": {"quant": "fp32", "shards": 1},
                "checksums": {},
                **({"hot_set": hot} if hot else {}),
            }
        )
    )


def test_hot_set_file_round_trips_and_refuses_what_the_version_does_not_match(tmp_path):
    t, r, c = np.array([1, 0, 0], np.uint32), np.array([4, 9, 2], np.uint64), np.array([7, 5, 5], np.uint64)
    rec = write_hot_set(tmp_path, t, r, c, 30, "log")
    assert rec["rows"] == 3 and rec["lookups"] == 30 and rec["source"] == "log"
    got = read_hot_set(tmp_path, _manifest(rec))
    assert got is not None and got[0].tolist() == [1, 0, 0] and got[1].tolist() == [4, 9, 2]
    assert read_hot_set(tmp_path, _manifest(None)) is None
    with pytest.raises(ValueError, match="hottest first"):
        write_hot_set(tmp_path, t, r, c[::-1], 30, "log")
    with pytest.raises(ValueError, match="one length"):
        write_hot_set(tmp_path, t, r[:2], c, 30, "log")
    # rows past a table's end, or a table the version lacks: not this version's hot set
    for bad_t, bad_r, why in (([1], [5], "past the end"), ([2], [0], "tables this version does not have")):
        d = tmp_path / why.replace(" ", "_")
        d.mkdir()
        bad = write_hot_set(d, np.array(bad_t, np.uint32), np.array(bad_r, np.uint64), np.array([1], np.uint64), 1, "x")
        with pytest.raises(ValueError, match=why):
            read_hot_set(d, _manifest(bad))
    _flip_a_byte(tmp_path / "hot_set.npz")
    with pytest.raises(ValueError, match="sha256 differs"):
        read_hot_set(tmp_path, _manifest(rec))
    (tmp_path / "hot_set.npz").unlink()
    with pytest.raises(ValueError, match="lacks"):
        read_hot_set(tmp_path, _manifest(rec))


def _open(models, seconds: float):
    from offgraph.server.config import ServerConfig
    from offgraph.server.models.loader import open_version

    return open_version(models / "ml" / "1", ServerConfig(models_dir=models, hot_set_seconds=seconds))


def test_export_records_the_training_rows_hot_set_and_a_server_seeds_it(small_run, tmp_path):
    from offgraph.export.export import export_run
    from offgraph.export.run_split import run_held_out_mask

    run, table = small_run
    spec = load_spec(run / "spec.yaml")
    models = tmp_path / "models"
    m = export_run(
        run, models / "ml" / "1", shards=2, quant="fp32", progress=False, hot_set_data=table, hot_set_rows=300
    )
    assert m.hot_set is not None and m.hot_set.rows == 300
    train = ~run_held_out_mask(run, spec, table)
    assert 0 < train.sum() < table.num_rows  # the held-out rows do not count
    want = _expected_top(_trained_lookups(spec, table.filter(train)), 300)
    tables, rows = read_hot_set(models / "ml" / "1", m)
    assert list(zip(tables.tolist(), rows.tolist())) == [(t, r) for t, r, _ in want]
    assert json.loads((models / "ml" / "1" / "manifest.json").read_text())["hot_set"]["rows"] == 300

    seeded, cold = _open(models, 30.0), _open(models, 0.0)
    try:
        hit_seeded, _, _ = seeded.scorer.row_cache.lookup_records(tables, rows)
        hit_cold, _, _ = cold.scorer.row_cache.lookup_records(tables, rows)
        assert hit_seeded.all()  # every hot row is in the row cache before the first request
        assert hit_cold.mean() < 0.5  # the warm-up requests alone leave most of them out
        # seeding changes what is cached, never a score
        cols = table.slice(0, 40).to_pydict()
        req = {c: cols[c][0] for c in ("user_id", "age", "gender", "occupation", "zip_prefix")}
        cands = [{c: cols[c][i] for c in ("movie_id", "genres", "title_words", "release_year")} for i in range(40)]
        assert np.array_equal(seeded.scorer.score(req, cands), cold.scorer.score(req, cands))
    finally:
        seeded.scorer.close()
        cold.scorer.close()

    # a hot set changed after export: the version is refused, as for any file that differs from its manifest
    _flip_a_byte(models / "ml" / "1" / "hot_set.npz")
    with pytest.raises(ValueError, match="sha256 differs"):
        _open(models, 30.0)


def test_seeding_stops_at_the_row_cache_capacity_and_the_time_limit(small_run, tmp_path):
    from offgraph.export.export import export_run
    from offgraph.server.config import ServerConfig
    from offgraph.server.models.loader import open_version

    run, table = small_run
    models = tmp_path / "models"
    m = export_run(run, models / "ml" / "1", shards=2, quant="fp32", progress=False, hot_set_data=table)
    assert m.hot_set is not None and m.hot_set.rows > 2000  # every row the training rows look up
    config = ServerConfig(models_dir=models, cache_mb=0.05, hot_set_seconds=30.0)
    sv = open_version(models / "ml" / "1", config)
    try:
        cap = sv.scorer.stats()["cache_capacity_rows"]
        assert 0 < cap < m.hot_set.rows
        tables, rows = read_hot_set(models / "ml" / "1", m)
        hit, _, _ = sv.scorer.row_cache.lookup_records(tables[:cap], rows[:cap])
        # as many as fit, hottest first: a set-associative cache filled to capacity leaves some of its
        # sets full while keys of those sets are still to come (TinyLFU admission keeps the hotter)
        assert hit.mean() > 0.7 and hit[: cap // 10].mean() > 0.9
        warm = {"tables": tables, "rows": rows, "fields": {f.table_id: (f.name, f.rows) for f in m.fields}}
        assert sv.scorer.warm_rows(warm, until=0.0) == 0  # past its time limit: no batch starts
    finally:
        sv.scorer.close()


def test_export_cli_refuses_a_negative_hot_set_size(tmp_path, capsys):
    import offgraph.cli

    out = tmp_path / "m" / "1"
    assert offgraph.cli.main(["export", "--run", str(tmp_path), "--out", str(out), "--hot-set-rows", "-1"]) == 2
    assert "--hot-set-rows must be >= 0, got -1" in capsys.readouterr().err
    assert not out.exists()
