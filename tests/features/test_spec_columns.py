"""The columns a spec reads, checked against a table's column names before its rows are read (a Parquet
schema, a CSV header line), each missing one named with what reads it and a did-you-mean."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from offgraph.features.spec import parse_spec
from offgraph.features.spec_columns import check_spec_columns, spec_columns
from offgraph.features.tables import DataError, column_names, read_table

SPEC = parse_spec(
    {
        "label": "label",
        "time": "ts",
        "split_key": "user",
        "fields": [
            {"name": "user", "scope": "request", "op": "id", "input": "user", "rows": 100},
            {"name": "day", "scope": "request", "op": "id", "input": "weekday", "rows": 8},
            {"name": "price", "scope": "item", "op": "numeric", "input": "price"},
        ],
    }
)


def unreadable_rows_parquet(path, table: pa.Table) -> None:
    """A Parquet file whose schema (the footer) reads and whose rows do not: a reader that touches the rows
    fails, so a check that passes on it read the schema only."""
    pq.write_table(table, path, compression="none")
    offset = pq.read_metadata(path).row_group(0).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[offset : offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(DataError):
        read_table(path)


def test_spec_columns_names_what_reads_each():
    assert spec_columns(SPEC) == {
        "user": "input of field 'user'",
        "weekday": "input of field 'day'",
        "price": "input of field 'price'",
        "label": "the spec's label column",
        "ts": "the spec's time column",
    }


def test_a_missing_column_is_named_with_what_reads_it_and_the_closest():
    with pytest.raises(DataError) as e:
        check_spec_columns(SPEC, ["label", "ts", "user", "wekday", "prices"], "t.parquet")
    msg = str(e.value)
    assert "no column 'weekday' (input of field 'day') (did you mean 'wekday'?)" in msg
    assert "'price' (input of field 'price') (did you mean 'prices'?)" in msg
    check_spec_columns(SPEC, ["label", "ts", "user", "weekday", "price", "extra"], "t.parquet")  # all there


def test_column_names_reads_no_rows(tmp_path):
    t = pa.table({"label": [0, 1] * 50, "weekday": list(range(100)), "user": list(range(100))})
    p = tmp_path / "t.parquet"
    unreadable_rows_parquet(p, t)
    assert column_names(p) == ["label", "weekday", "user"]
    d = tmp_path / "dataset"
    d.mkdir()
    pq.write_table(t, d / "part-0.parquet")
    assert column_names(d) == ["label", "weekday", "user"]
    csv = tmp_path / "t.csv"
    csv.write_text("label,weekday,user\n1,2\n")  # a short row: read_table would refuse it
    assert column_names(csv) == ["label", "weekday", "user"]
    tsv = tmp_path / "t.tsv"
    tsv.write_text("1\t2\t3\n")
    assert column_names(tsv, header=False, names=["a", "b", "c"]) == ["a", "b", "c"]
    assert column_names(tsv, header=False) is None  # pyarrow's f0, f1, ...: only the rows tell
    jl = tmp_path / "t.jsonl"
    jl.write_text('{"a": 1}\n')
    assert column_names(jl) is None
    with pytest.raises(DataError, match="no such file"):
        column_names(tmp_path / "nope.parquet")


def test_a_header_with_a_name_twice_is_told_as_reading_would(tmp_path):
    """A headerless file read as if its first row were the header: the same hint as read_table's."""
    tsv = tmp_path / "t.tsv"
    tsv.write_text("1\t1\n0\tv\n")
    with pytest.raises(DataError, match=r"\['1'\] appear more than once in the header line; a file without"):
        column_names(tsv)
    with pytest.raises(DataError, match=r"appear more than once"):
        read_table(tsv)
