"""`offgraph spec check SPEC [--data FILE]` and `offgraph spec schema` (the spec's JSON Schema, kept in
docs/spec.schema.json for editors)."""

import copy
from pathlib import Path

import jsonschema_rs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from offgraph.cli import main
from offgraph.cli.spec import SCHEMA_FILE
from offgraph.features.spec_schema import schema_json, spec_schema

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_check_prints_a_summary_and_exits_0(capsys):
    assert main(["spec", "check", str(REPO / "examples" / "movielens.yaml")]) == 0
    out = capsys.readouterr().out
    assert "examples/movielens.yaml: ok: 13 embedding field(s), 0 numeric; ops id x8, bucketize x2, cross x3" in out
    assert "time 'timestamp'; split_key 'user_id'" in out and "tables ['user', 'item']" in out
    assert "default split: per-key-time" in out
    assert main(["spec", "check", str(REPO / "examples" / "criteo.yaml")]) == 0
    assert "default split: random (the spec has no 'time' and no 'split_key'" in capsys.readouterr().out


def test_check_exits_2_with_the_error(tmp_path, capsys):
    raw = yaml.safe_load((REPO / "examples" / "frappe.yaml").read_text())
    raw["fields"][0]["op"] = "idd"
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(raw))
    assert main(["spec", "check", str(p)]) == 2
    captured = capsys.readouterr()
    assert "offgraph spec: error: spec " in captured.err and "unknown op 'idd' (did you mean 'id'?)" in captured.err
    assert captured.out == ""


def test_check_with_data_checks_the_columns(tmp_path, capsys):
    spec = REPO / "examples" / "frappe.yaml"
    names = [c for c in yaml.safe_load(spec.read_text())["fields"] if "input" in c]
    cols = {f["input"]: [1, 2] for f in names} | {"label": [0, 1]}
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table(cols), good)
    assert main(["spec", "check", str(spec), "--data", str(good)]) == 0
    assert f"data {good}: has all {len(cols)} column(s) the spec reads" in capsys.readouterr().out
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({("wekday" if c == "weekday" else c): v for c, v in cols.items()}), bad)
    assert main(["spec", "check", str(spec), "--data", str(bad)]) == 2
    captured = capsys.readouterr()
    assert "no column 'weekday' (input of field 'weekday') (did you mean 'wekday'" in captured.err, captured.err
    assert captured.out == ""  # no "ok" for a spec whose table lacks a column


def test_the_committed_schema_is_up_to_date(capsys):
    assert main(["spec", "schema"]) == 0
    printed = capsys.readouterr().out
    assert printed == schema_json()
    assert (REPO / SCHEMA_FILE).read_text() == printed, f"run: offgraph spec schema > {SCHEMA_FILE}"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_schema_takes_every_example(path):
    jsonschema_rs.validate(spec_schema(), yaml.safe_load(path.read_text()))


@pytest.mark.parametrize(
    "change",
    [
        lambda r: r["fields"][0].update(op="idd"),
        lambda r: r["fields"][0].pop("rows"),
        lambda r: r["fields"][0].update(separatr="|"),
        lambda r: r["fields"][0].update(boundaries=[1, 2]),  # not a parameter of op id
        lambda r: r["fields"][0].update(scope="cross"),  # a raw-column op reads one place
        lambda r: r.update(lable="y"),
        lambda r: r.update(model={"embedding_dim": 0}),
        lambda r: r.update(tables={"User": {"key": "user_id", "columns": ["age"]}}),
    ],
)
def test_the_schema_refuses_what_the_parser_refuses(change):
    from offgraph.features.spec import SpecError, parse_spec

    raw = copy.deepcopy(yaml.safe_load((REPO / "examples" / "movielens.yaml").read_text()))
    change(raw)
    assert not jsonschema_rs.is_valid(spec_schema(), raw)
    with pytest.raises(SpecError):
        parse_spec(raw)
