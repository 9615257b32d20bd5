"""Feature-table values: what the writers refuse (FG's own value rules, size bounds, equal
seqs), what the server does with a stored row FG refuses (unknown, never a 422), and clear load errors."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO

from offgraph.feature_tables.db import FeatureTableError
from offgraph.feature_tables.load import load_table
from offgraph.features.spec import load_spec, parse_spec
from offgraph.streaming.deltas import DeltaFormatError, encode_feature_delta
from offgraph.streaming.deltas import read as read_delta_bytes

SPEC = REPO / "examples" / "movielens.yaml"


def _movies(n=6, **over):
    cols = {
        "movie_id": list(range(1, n + 1)),
        "genres": [["Drama"]] * n,
        "title_words": [["a", "b"]] * n,
        "release_year": [1990 + i for i in range(n)],
    }
    cols.update(over)
    return pa.table(cols)


def _load_cli(tmp_path, data, table="item", *extra):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "features",
            "load",
            "--model",
            str(tmp_path / "ml"),
            "--spec",
            str(SPEC),
            "--table",
            table,
            "--data",
            str(data),
            "--no-progress",
            *extra,
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )


# ------------------------------------------------------------------ item 6: write time


@pytest.mark.parametrize(
    "over, where, rule",
    [
        (
            {"genres": [["Drama"]] * 3 + [[f"g{i}" for i in range(5000)]] + [["Drama"]] * 2},
            "row 4 (movie_id=4): column 'genres' (field 'genres')",
            "5000 values, more than the field's max_values of 1000",
        ),
        (
            {"release_year": ["1990", "1991", "abc", "1993", "1994", "1995"]},
            "row 3 (movie_id=3): column 'release_year' (field 'release_year')",
            "expected a number, got 'abc'",
        ),
        ({"release_year": [True] * 6}, "row 1 (movie_id=1): column 'release_year'", "expected a number, got True"),
        (
            {"release_year": [1990.0, float("inf"), 1, 2, 3, 4]},
            "row 2 (movie_id=2): column 'release_year'",
            "expected a finite number, got inf",
        ),
    ],
)
def test_load_refuses_values_fg_refuses_naming_row_column_rule(tmp_path, over, where, rule):
    spec = load_spec(SPEC)
    with pytest.raises(FeatureTableError) as e:
        load_table(tmp_path / "ml", spec.tables[1], spec, _movies(**over), progress=False)
    assert where in str(e.value) and rule in str(e.value), str(e.value)
    assert not (tmp_path / "ml" / "features").exists()  # refused before anything was written


def test_cli_load_names_the_csv_line_of_a_bad_user_row(tmp_path):
    """`age` "abc" (bucketized by age_bucket) in a CSV: rc 2, the file's line (a blank line and a quoted line break
    before it count), the column, the field and the rule."""
    data = tmp_path / "users.csv"
    data.write_text('user_id,age,gender,occupation,zip_prefix\n1,24,M,"tech\nnician",85\n\n2,abc,F,writer,94\n')
    out = _load_cli(tmp_path, data, "user")
    assert out.returncode == 2, out
    assert "line 5 (user_id=2): column 'age' (field 'age_bucket'): expected a number, got 'abc'" in out.stderr, (
        out.stderr
    )
    jl = tmp_path / "movies.jsonl"
    jl.write_text(
        "\n".join(
            json.dumps({"movie_id": i, "genres": ["Drama"], "title_words": ["x"], "release_year": True}) for i in (1, 2)
        )
        + "\n"
    )
    out = _load_cli(tmp_path, jl)
    assert out.returncode == 2 and "line 1 (movie_id=1): column 'release_year'" in out.stderr, out.stderr
    assert "expected a number, got True" in out.stderr


# ------------------------------------------------------------------ item 8: size bounds


def test_oversized_values_and_rows_are_refused_at_write_time(tmp_path):
    spec = load_spec(SPEC)
    item = spec.tables[1]
    assert (item.max_value_bytes, item.max_row_bytes) == (64 * 1024, 256 * 1024)  # the documented defaults
    big = _movies(title_words=[["a"]] * 4 + [["w" * 1_000_000]] + [["a"]])  # a 1 MB title
    with pytest.raises(
        FeatureTableError,
        match=r"row 5 \(movie_id=5\): column 'title_words': a value of 1,000,000 "
        r"bytes, more than the table's max_value_bytes of 65,536",
    ):
        load_table(tmp_path / "ml", item, spec, big, progress=False)
    # the bounds are settings of the table in the spec
    raw = dict(spec.raw)
    raw["tables"] = {"item": {"key": "movie_id", "columns": list(item.columns), "max_row_bytes": 100}}
    small = parse_spec(raw).tables[0]
    rows = _movies(title_words=[["a"]] * 5 + [["w" * 40, "v" * 60]])
    with pytest.raises(
        FeatureTableError,
        match=r"row 6 \(movie_id=6\): a row of 1\d\d bytes, more than the table's "
        r"max_row_bytes of 100",
    ):
        load_table(tmp_path / "ml", small, spec, rows, progress=False)
    with pytest.raises(ValueError, match="'max_value_bytes' must be an integer >= 1"):
        parse_spec({**raw, "tables": {"item": {"key": "movie_id", "columns": ["genres"], "max_value_bytes": 0}}})


# ------------------------------------------------------------------ item 7: equal seqs in one feature delta


def test_feature_delta_with_two_rows_of_one_key_at_one_seq_is_refused_like_embedding_deltas():
    from offgraph.streaming.deltas import build_row_table as build_embedding_deltas

    row = {"movie_id": 7, "genres": ["a"], "title_words": ["b"], "release_year": 1990}
    kw = dict(model="ml", table="item", key="movie_id", event_time_ms=1)
    with pytest.raises(DeltaFormatError) as feat:  # 7.0 is the same movie as 7 (canonical keys)
        read_delta_bytes(
            encode_feature_delta(rows=[row, {**row, "movie_id": 8}, {**row, "movie_id": 7.0}], seqs=[3, 3, 3], **kw)
        )
    with pytest.raises(DeltaFormatError) as emb:
        build_embedding_deltas(
            model="ml",
            model_version=1,
            table_ids=[0, 0],
            rows=[5, 5],
            vectors=np.zeros((2, 4)),
            first_order=np.zeros(2),
            seqs=[3, 3],
            event_time_ms=1,
        )
    assert str(feat.value).startswith("deltas 0 and 2 both update movie_id='7' at seq 3 (1 such duplicates): ")
    assert str(emb.value).startswith("deltas 0 and 1 both update table_id 0 row 5 at seq 3 (1 such duplicates): ")
    rule = "one seq of a row must have one value (give each update its own seq; the highest wins)"
    assert str(emb.value).endswith(rule) and str(feat.value).endswith(rule)
    assert len(read_delta_bytes(encode_feature_delta(rows=[row, row], seqs=[3, 4], **kw))) == 2  # other seqs: fine


# ------------------------------------------------------------------ item 9: load errors that say what is wrong


def test_load_errors_say_what_is_wrong(tmp_path):
    head = "movie_id,genres,title_words,release_year"
    wide = tmp_path / "wide.csv"  # a header line over pyarrow's 1 MiB block ("Empty CSV file or block" before)
    extra = [f"x{i:04d}" + "_" * 600 for i in range(2000)]
    wide.write_text(
        ",".join([head, *extra]) + "\n" + "\n".join(f"{i},Drama,w,1990" + "," * len(extra) for i in (1, 2)) + "\n"
    )
    out = _load_cli(tmp_path, wide)
    assert out.returncode == 0 and "loaded 2 rows" in out.stdout and "ignored 2000 column(s)" in out.stdout, out
    out = _load_cli(tmp_path, tmp_path / "nope.csv")
    assert out.returncode == 2 and "nope.csv: no such file" in out.stderr, out.stderr
    d = tmp_path / "dir"
    d.mkdir()
    (d / "movies.csv").write_text(f"{head}\n1,Drama,w,1990\n")
    out = _load_cli(tmp_path, d)
    assert out.returncode == 2 and "is not a Parquet file" in out.stderr and "movies.csv" in out.stderr, out.stderr
    (d / "movies.csv").unlink()
    pq.write_table(_movies(3), d / "part-0.parquet")
    pq.write_table(_movies(6).slice(3), d / "part-1.parquet")
    out = _load_cli(tmp_path, d)
    assert out.returncode == 0 and "loaded 6 rows from the Parquet dataset of 2 file(s)" in out.stdout, out
    dup = tmp_path / "dup.csv"
    dup.write_text(f"{head}\n1,Drama,w,1990\n2,Drama,w,1990\n\n1,Comedy,w,1991\n")
    out = _load_cli(tmp_path, dup)
    assert out.returncode == 2 and "duplicate key movie_id='1' at line 2 and line 5" in out.stderr, out.stderr
    pq.write_table(_movies(movie_id=[1, 2, 3, 1, 5, 6]), tmp_path / "dup.parquet")
    out = _load_cli(tmp_path, tmp_path / "dup.parquet")
    assert out.returncode == 2 and "duplicate key movie_id='1' at row 1 and row 4" in out.stderr, out.stderr


def test_value_errors_finds_every_row_the_serving_fg_refuses():
    """The writers' check IS FG's rules: on a column mix of good and bad values, the rows `value_errors` names are
    exactly those `FeatureGenerator.transform` refuses one by one (an infinite year before a text one, two lists
    over max_values of different lengths, a nested value, a boolean where a number is read)."""
    from offgraph.features.fg import FeatureGenerator, FeatureValueError
    from offgraph.features.value_limits import value_errors

    spec = load_spec(SPEC)
    cols = {
        "genres": [["Drama"], ["g"] * 1200, ["Drama"], ["g"] * 1500, ["Drama"], [["nested"]], ["Drama"], None],
        "title_words": [["a"], ["b"], ["c"], ["d"], ["w"] * 1001, ["e"], ["f"], "one title"],
        "release_year": [1990, 1991, float("inf"), "1993", 1994, 1995, "abc", True],
    }
    n = 8
    got = {b.row: b for b in value_errors(spec, cols, n)}
    fg = FeatureGenerator(spec)
    refused = set()
    for i in range(n):
        try:
            fg.transform({}, [{"movie_id": i, **{c: v[i] for c, v in cols.items()}}])
        except FeatureValueError:
            refused.add(i)
    assert set(got) == refused == {1, 2, 3, 4, 5, 6, 7}
    assert got[4].column == "title_words" and "1001 values, more than the field's max_values of 1000" in got[4].problem
    assert got[2].problem == "expected a finite number, got inf" and got[7].problem == "expected a number, got True"
    assert value_errors(spec, {"genres": [["Drama"]] * 3}, 3) == []
