"""Feature tables: the spec's `tables`, their RocksDB store, bulk loads and their refusals (no model, no server)."""

import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import REPO

from offgraph.feature_tables.db import FeatureDB, FeatureTableError, encode_row, row_key, table_dir
from offgraph.feature_tables.load import latest_per_key, load_table
from offgraph.features import parse_spec
from offgraph.features.spec import SpecError, load_spec


def _raw(tables=None):
    raw = yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text())
    raw.pop("tables")
    if tables is not None:
        raw["tables"] = tables
    return raw


def test_example_declares_user_and_item_tables():
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    assert [(t.name, t.key, t.scope) for t in spec.tables] == [
        ("user", "user_id", "request"),
        ("item", "movie_id", "item"),
    ]
    assert spec.tables[1].columns == ("genres", "title_words", "release_year")


def test_spec_without_tables_is_unchanged():
    """An old spec has no tables and the fingerprint of its raw dict (nothing added by parsing)."""
    raw = _raw()
    spec = parse_spec(raw)
    assert spec.tables == ()
    assert "tables" not in spec.raw and spec.fingerprint() == parse_spec(_raw()).fingerprint()
    assert spec.to_dict() == raw


@pytest.mark.parametrize(
    "tables, msg",
    [
        ({"item": {"key": "nope", "columns": ["genres"]}}, "key 'nope' is not a raw input"),
        ({"item": {"key": "movie_id", "columns": ["age"]}}, "column 'age' is a request-scope input"),
        ({"item": {"key": "movie_id", "columns": ["genre"]}}, "column 'genre' is not a raw input"),
        ({"item": {"key": "movie_id", "columns": []}}, "'columns' must be a non-empty list"),
        ({"item": {"key": "movie_id", "columns": ["movie_id"]}}, "cannot be one of its own columns"),
        (
            {"item": {"key": "movie_id", "columns": ["genres"]}, "item2": {"key": "movie_id", "columns": ["genres"]}},
            "column 'genres' is already filled by table 'item'",
        ),
        ({"Item": {"key": "movie_id", "columns": ["genres"]}}, "lowercase letters"),
        ({"item": {"key": "movie_id", "columns": ["genres"], "extra": 1}}, "'key', 'columns' and optionally"),
        ([1], "'tables' must be a mapping"),
    ],
)
def test_bad_tables_are_spec_errors_naming_the_table(tables, msg):
    with pytest.raises(SpecError, match=msg):
        parse_spec(_raw(tables))


def _movies(n=50, **over):
    cols = {
        "movie_id": list(range(1, n + 1)),
        "genres": [["Drama"], ["Comedy", "Romance"]] * (n // 2),
        "title_words": [["a", "b"]] * n,
        "release_year": [1990 + i % 9 for i in range(n)],
    }
    cols.update(over)
    return pa.table(cols)


def test_load_then_read_in_one_batch_and_canonical_keys(tmp_path):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    item = spec.tables[1]
    res = load_table(tmp_path / "ml", item, spec, _movies(), progress=False)
    assert res["rows"] == 50 and res["ignored_columns"] == []
    with FeatureDB(table_dir(tmp_path / "ml", "item"), "r") as db:
        got = db.get([row_key(2), row_key("2"), row_key(2.0), row_key(999), None])
    assert got[0] == {"genres": ["Comedy", "Romance"], "title_words": ["a", "b"], "release_year": 1991}
    assert got[1] == got[2] == got[0] and got[3] is None and got[4] is None


def test_load_refuses_wrong_schema_and_duplicate_keys(tmp_path):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    item = spec.tables[1]
    with pytest.raises(FeatureTableError, match=r"needs column\(s\) \['release_year'\]"):
        load_table(tmp_path, item, spec, _movies().drop(["release_year"]), progress=False)
    with pytest.raises(FeatureTableError, match="column 'release_year' is a list"):
        load_table(tmp_path, item, spec, _movies(release_year=[[1990]] * 50), progress=False)
    with pytest.raises(FeatureTableError, match=r"duplicate key movie_id='7' at row 7 and row 10;"):
        load_table(tmp_path, item, spec, _movies(movie_id=[*range(1, 10), 7, *range(11, 51)]), progress=False)
    with pytest.raises(FeatureTableError, match="key column 'movie_id' is null at row 4"):
        load_table(tmp_path, item, spec, _movies(movie_id=[1, 2, 3, None, *range(5, 51)]), progress=False)
    assert not (tmp_path / "features").exists()  # nothing was created by a refused file


def test_write_last_wins_by_seq_with_positions_in_the_batch(tmp_path):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    with FeatureDB.create(tmp_path / "item", spec.tables[1]) as db:
        k = row_key(5)
        assert db.write([k, k], [{"release_year": 1}, {"release_year": 2}], [3, 4], meta={b"spool": b"a"}) == (1, 1)
        assert db.write([k], [{"release_year": 9}], [4]) == (0, 1)  # not newer: skipped
        assert db.get([k]) == [{"release_year": 2}] and db.get_meta(b"spool") == b"a"
        follower = FeatureDB(tmp_path / "item", "follow")
        db.write([k], [{"release_year": 3}], [5])
        follower.catch_up()
        assert follower.get([k]) == [{"release_year": 3}]
        follower.close()


def test_a_follower_catches_up_only_when_the_writer_changed_its_files_and_sees_every_change(tmp_path):
    """A write (the WAL), a flush (a new SST and the MANIFEST) and an ingested file of a new key (the MANIFEST
    only: it takes no sequence number) each make the next catch-up run and be seen; with nothing new it is
    skipped."""
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    with FeatureDB.create(tmp_path / "item", spec.tables[1]) as db:
        db.write([row_key(1)], [{"release_year": 1}], [1])
        follower = FeatureDB(tmp_path / "item", "follow")
        try:
            assert follower.catch_up() is True  # the first one always runs
            assert follower.catch_up() is False and follower.catch_up() is False
            db.write([row_key(1)], [{"release_year": 2}], [2])
            assert follower.catch_up() is True and follower.get([row_key(1)]) == [{"release_year": 2}]
            assert follower.catch_up() is False
            db.flush()
            assert follower.catch_up() is True and follower.get([row_key(1)]) == [{"release_year": 2}]
            seq = db.change_mark()[0]
            assert db.ingest_sorted([(row_key(7), encode_row(1, {"release_year": 7}))], tmp_path) == 1
            assert db.change_mark()[0] == seq  # no sequence number taken: only the MANIFEST moved
            assert follower.catch_up() is True and follower.get([row_key(7)]) == [{"release_year": 7}]
            assert follower.catch_up() is False
        finally:
            follower.close()


def test_a_second_writer_is_refused_clearly(tmp_path):
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    with FeatureDB.create(tmp_path / "item", spec.tables[1]):
        with pytest.raises(FeatureTableError, match="another writer"):
            FeatureDB(tmp_path / "item", "w")


def test_latest_value_per_key_before_the_cut():
    t = pa.table({"movie_id": [1, 2, 1, 1, 2], "timestamp": [5, 1, 9, 7, 2], "release_year": [10, 20, 11, 12, 21]})
    got = latest_per_key(t, "movie_id", "timestamp")
    assert sorted(zip(got.column("movie_id").to_pylist(), got.column("release_year").to_pylist())) == [(1, 11), (2, 21)]
    cut = latest_per_key(t, "movie_id", "timestamp", mask=[True, True, False, True, False])
    assert sorted(zip(cut.column("movie_id").to_pylist(), cut.column("release_year").to_pylist())) == [(1, 12), (2, 20)]


def test_cli_load_errors_name_the_problem(tmp_path):
    bad = tmp_path / "movies.parquet"
    pq.write_table(_movies(movie_id=[1] * 50), bad)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "features",
            "load",
            "--model",
            str(tmp_path / "ml"),
            "--spec",
            str(REPO / "examples" / "movielens.yaml"),
            "--table",
            "item",
            "--data",
            str(bad),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2 and "duplicate key movie_id='1' at row 1 and row 2;" in out.stderr, out.stderr
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "features",
            "load",
            "--model",
            str(tmp_path / "ml"),
            "--spec",
            str(REPO / "examples" / "movielens.yaml"),
            "--table",
            "movies",
            "--data",
            str(bad),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 2 and "declares no table 'movies'" in out.stderr, out.stderr


def test_feature_delta_round_trip_and_malformed_files(tmp_path):
    from offgraph.streaming.deltas import (
        DeltaFormatError,
        FeatureDeltaBatch,
        encode_feature_delta,
        publish_feature_delta,
    )
    from offgraph.streaming.deltas import build_feature_table as build_table
    from offgraph.streaming.deltas import read as read_delta_bytes
    from offgraph.streaming.deltas import read as read_delta_file

    rows = [{"movie_id": 242, "genres": ["Comedy"], "title_words": ["kolya"], "release_year": 1996}]
    p = publish_feature_delta(tmp_path, model="ml", table="item", key="movie_id", rows=rows, seqs=[3], event_time_ms=5)
    b = read_delta_file(p)
    assert isinstance(b, FeatureDeltaBatch) and (b.model, b.table, b.key) == ("ml", "item", "movie_id")
    assert b.keys == [row_key(242)] and b.rows == [{k: v for k, v in rows[0].items() if k != "movie_id"}]
    assert b.columns == ("genres", "title_words", "release_year") and b.seqs.tolist() == [3]
    ok = dict(model="ml", table="item", key="movie_id", rows=rows, seqs=[3], event_time_ms=5)
    assert read_delta_bytes(encode_feature_delta(**ok)).rows == b.rows

    def broken(edit) -> bytes:
        import io

        t = edit(build_table(**ok))
        buf = io.BytesIO()
        with pa.ipc.new_file(buf, t.schema) as w:
            w.write_table(t)
        return buf.getvalue()

    meta = build_table(**ok).schema.metadata
    cases = [
        (lambda t: t.replace_schema_metadata({k: v for k, v in meta.items() if k != b"key"}), "'key' metadata"),
        (lambda t: t.drop(["seq"]), "without the 'seq' column"),
        (lambda t: t.set_column(t.column_names.index("seq"), "seq", pa.array([-1])), "must be >= 0"),
        (lambda t: t.set_column(0, "movie_id", pa.array([None], pa.int64())), "no value at row 0"),
    ]
    for edit, msg in cases:
        with pytest.raises(DeltaFormatError, match=msg):
            read_delta_bytes(broken(edit))


def test_cli_load_success_replaces_rows(tmp_path):
    data = tmp_path / "movies.parquet"
    pq.write_table(_movies(), data)
    args = [
        sys.executable,
        "-m",
        "offgraph.cli",
        "features",
        "load",
        "--model",
        str(tmp_path / "ml"),
        "--spec",
        str(REPO / "examples" / "movielens.yaml"),
        "--table",
        "item",
        "--data",
        str(data),
        "--no-progress",
    ]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and "loaded 50 rows" in out.stdout, out.stderr
    pq.write_table(_movies(10, release_year=[1900] * 10, genres=[["X"]] * 10, title_words=[["y"]] * 10), data)
    assert subprocess.run(args, capture_output=True, text=True, cwd=REPO).returncode == 0
    with FeatureDB(table_dir(tmp_path / "ml", "item"), "r") as db:
        assert [r["release_year"] for r in db.get([row_key(3), row_key(30)])] == [1900, 1990 + 29 % 9]


def test_exporter_path_never_opens_a_held_table_and_keeps_streamed_rows(tmp_path):
    """Exporting beside a running updater: creating/extending a table does not open its DB (the updater holds the
    lock); the exporter's load keeps rows a stream wrote (newer than a training cut), `features load` replaces them."""
    from offgraph.feature_tables.build import build_feature_tables
    from offgraph.feature_tables.db import ensure_table

    spec = load_spec(REPO / "examples" / "movielens.yaml")
    item = spec.tables[1]
    load_table(tmp_path / "ml", item, spec, _movies(), progress=False)
    with FeatureDB(table_dir(tmp_path / "ml", "item"), "w") as held:  # the updater, say
        held.write([row_key(3)], [{"genres": ["Streamed"], "title_words": [], "release_year": 2001}], [3])
        build_feature_tables(tmp_path / "ml", spec, None)  # a new version's export without data: no lock needed
        wider = parse_spec(
            {**_raw(), "tables": {"item": {"key": "movie_id", "columns": ["genres", "release_year", "title_words"]}}}
        )
        ensure_table(table_dir(tmp_path / "ml", "item"), wider.tables[0])
    res = load_table(tmp_path / "ml", item, spec, _movies(), progress=False, keep_streamed=True)
    assert res["kept_streamed"] == 1 and res["rows"] == 49
    with FeatureDB(table_dir(tmp_path / "ml", "item"), "r") as db:
        assert db.get([row_key(3)])[0]["release_year"] == 2001
    load_table(tmp_path / "ml", item, spec, _movies(), progress=False)  # an operator's load replaces it
    with FeatureDB(table_dir(tmp_path / "ml", "item"), "r") as db:
        assert db.get([row_key(3)])[0]["release_year"] == 1992
    assert (table_dir(tmp_path / "ml", "user") / "db" / "CURRENT").exists()  # created empty by the export
