"""offgraph.features.tables.read_table: Parquet, CSV/TSV, JSON lines, malformed rows."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parts import DATA, need

from offgraph.features.tables import DataError, detect_format, read_table


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- Parquet


def test_parquet_roundtrip_and_columns(tmp_path):
    t = pa.table({"a": [1, 2, None], "b": ["x", None, "z"], "c": [[1], [], [2, 3]]})
    pq.write_table(t, tmp_path / "t.parquet")
    got = read_table(tmp_path / "t.parquet")
    assert got.equals(t)
    assert read_table(tmp_path / "t.parquet", columns=["b"]).to_pydict() == {"b": ["x", None, "z"]}


def test_parquet_compressed_suffix(tmp_path):
    t = pa.table({"a": [1, 2]})
    pq.write_table(t, tmp_path / "t.parquet.brotli", compression="brotli")
    assert detect_format(tmp_path / "t.parquet.brotli") == "parquet"
    assert read_table(tmp_path / "t.parquet.brotli").to_pydict() == {"a": [1, 2]}


def test_parquet_missing_column(tmp_path):
    pq.write_table(pa.table({"a": [1]}), tmp_path / "t.parquet")
    with pytest.raises(DataError, match="nope"):
        read_table(tmp_path / "t.parquet", columns=["nope"])


# ---------------------------------------------------------------- CSV / TSV


def test_csv_with_header_types_and_nulls(tmp_path):
    p = write(
        tmp_path / "t.csv",
        "id,count,price,hexid,zip,word\n1,5,0.5,68fd1e64,00501,a\n2,,1.25,3e10,94043,\n3,7,2,12345678,85711,c\n",
    )
    t = read_table(p)
    assert t.column_names == ["id", "count", "price", "hexid", "zip", "word"]
    assert t.schema.field("id").type == pa.int64()
    assert t.schema.field("count").type == pa.int64()
    assert t.column("count").to_pylist() == [5, None, 7]  # empty -> null, not 0
    assert t.schema.field("price").type == pa.float64()
    assert t.column("price").to_pylist() == [0.5, 1.25, 2.0]
    # "3e10" and "12345678" must not turn into numbers: the column is hex ids
    assert t.column("hexid").to_pylist() == ["68fd1e64", "3e10", "12345678"]
    # leading zeros keep a code a string
    assert t.column("zip").to_pylist() == ["00501", "94043", "85711"]
    assert t.column("word").to_pylist() == ["a", None, "c"]  # empty -> null, not ""


def test_tsv_without_header_with_names(tmp_path):
    p = write(tmp_path / "t.tsv", "0\t1\t\t68fd1e64\n1\t\t44\t\n0\t3\t5\t0b153874\n")
    t = read_table(p, names=["label", "I1", "I2", "C1"])
    assert t.num_rows == 3  # first line is data
    assert t.schema.field("I1").type == pa.int64()
    assert t.column("I1").to_pylist() == [1, None, 3]
    assert t.column("I2").to_pylist() == [None, 44, 5]
    assert t.schema.field("C1").type == pa.string()
    assert t.column("C1").to_pylist() == ["68fd1e64", None, "0b153874"]


def test_explicit_sep_fmt_header_replaced_and_types(tmp_path):
    p = write(tmp_path / "data.txt", "a|b\n1|x\n2|y\n")
    t = read_table(p, fmt="csv", sep="|", header=True, names=["k", "v"], types={"k": "string"})
    assert t.to_pydict() == {"k": ["1", "2"], "v": ["x", "y"]}


def test_csv_columns_and_gzip(tmp_path):
    p = tmp_path / "t.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write("a,b,c\n1,2,3\n4,5,6\n")
    assert read_table(p, columns=["c", "a"]).to_pydict() == {"c": [3, 6], "a": [1, 4]}
    with pytest.raises(DataError, match="zz"):
        read_table(p, columns=["zz"])


def test_csv_malformed_row_names_line(tmp_path):
    p = write(tmp_path / "bad.csv", "a,b,c\n1,2,3\n4,5,6\n7,8\n9,10,11\n")
    with pytest.raises(DataError) as e:
        read_table(p)
    msg = str(e.value)
    assert "bad.csv" in msg and "line 4" in msg, msg


def test_csv_malformed_row_line_counts_blank_and_quoted_lines(tmp_path):
    # line 1 header, 2 blank, 3-4 one quoted two-line record, 5 blank, 6 ok, 7 bad
    p = write(tmp_path / "q.csv", 'a,b\n\n1,"x\ny"\n\n3,4\n5,6,7\n8,9\n')
    with pytest.raises(DataError, match=r"line 7\b"):
        read_table(p)


def test_tsv_malformed_row_far_down(tmp_path):
    lines = [f"{i}\t{i * 2}\tx{i}" for i in range(5000)]
    lines[3210] = "1\t2\t3\t4"  # line 3211 of the file (no header)
    p = write(tmp_path / "bad.tsv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"line 3211\b"):
        read_table(p, names=["a", "b", "c"])


def test_unknown_extension(tmp_path):
    p = write(tmp_path / "t.weird", "a\n1\n")
    with pytest.raises(DataError, match="fmt"):
        read_table(p)
    assert read_table(p, fmt="csv").to_pydict() == {"a": [1]}


# ---------------------------------------------------------------- JSON lines


def test_json_lines(tmp_path):
    p = write(
        tmp_path / "t.jsonl",
        '{"user": "u1", "age": 30, "terms": ["a", "b"], "hex": "68fd1e64"}\n'
        '{"user": "u2", "age": null, "terms": [], "hex": "3e10"}\n'
        '{"user": "u3", "terms": ["c"], "hex": null}\n',
    )
    t = read_table(p)
    assert t.column("user").to_pylist() == ["u1", "u2", "u3"]
    assert t.column("age").to_pylist() == [30, None, None]
    assert t.column("terms").to_pylist() == [["a", "b"], [], ["c"]]
    assert t.column("hex").to_pylist() == ["68fd1e64", "3e10", None]
    assert read_table(p, columns=["age"]).column_names == ["age"]


def test_json_malformed_line_names_line(tmp_path):
    good = '{"a": 1, "b": "x"}\n'
    p = write(tmp_path / "bad.jsonl", good * 6 + '{"a": 2, "b": "y"\n' + good * 3)
    with pytest.raises(DataError) as e:
        read_table(p)
    msg = str(e.value)
    assert "bad.jsonl" in msg and "line 7" in msg, msg


def test_json_non_object_line(tmp_path):
    p = write(tmp_path / "bad.json", '{"a": 1}\n\n[1, 2]\n')
    with pytest.raises(DataError, match="line 3"):
        read_table(p, fmt="json")


# ---------------------------------------------------------------- real data


def test_real_criteo_tsv_types():
    need("criteo-10k")
    names = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    path = DATA["criteo-10k"].folder() / "criteo_10k.tsv"
    t = read_table(path, names=names)
    raw = [line.rstrip("\n").split("\t") for line in path.open()]
    assert t.num_rows == len(raw) == 10_000
    for j, name in enumerate(names):
        want_type = pa.string() if name.startswith("C") else pa.int64()
        assert t.schema.field(name).type == want_type, name
        assert t.column(name).null_count == sum(1 for r in raw if r[j] == ""), name
    assert t.column("C1").to_pylist()[:2] == [raw[0][14], raw[1][14]]
    assert t.column("I5").to_pylist()[:2] == [int(raw[0][5]), int(raw[1][5])]
