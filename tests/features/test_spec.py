import copy
from pathlib import Path

import pytest

from offgraph.features.spec import SpecError, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]

BASE = {
    "model": {"embedding_dim": 8, "hash": "xxh64", "mlp": [16]},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 100},
        {"name": "gender", "scope": "request", "op": "id", "input": "gender", "rows": 8},
        {"name": "cat", "scope": "item", "op": "id", "input": "cat_id", "rows": 50},
        {"name": "g_x_c", "scope": "cross", "op": "cross", "inputs": ["gender", "cat"], "rows": 64},
    ],
}


def mutate(fn):
    raw = copy.deepcopy(BASE)
    fn(raw)
    return raw


def test_base_spec_loads():
    spec = parse_spec(BASE)
    assert spec.field_names == ["user", "gender", "cat", "g_x_c"]
    assert spec.fields[3].params["separator"] == "_"
    assert spec.model.pooling == "mean"


@pytest.mark.parametrize(
    "fn, msg",
    [
        (lambda r: r["fields"][2].update(op="hashify"), "field 'cat': unknown op 'hashify'"),
        (lambda r: r["fields"][2].pop("input"), "field 'cat': missing 'input'"),
        (lambda r: r["fields"][0].update(rows=0), "field 'user': rows must be an integer >= 1"),
        (lambda r: r["fields"][3].update(inputs=["gender", "brand"]), "field 'g_x_c': input 'brand' is not a field"),
        (lambda r: r["fields"][3].update(scope="item"), "field 'g_x_c': declared scope 'item'"),
        (lambda r: r["fields"][1].update(name="user"), "field 'user': duplicate field name"),
        (lambda r: r["fields"][0].update(pooling="max"), "field 'user': pooling must be one of"),
        (lambda r: r["fields"][0].update(boundaries=[1, 2]), "field 'user': unknown parameter"),
        (
            lambda r: r["fields"].append(
                {"name": "b", "scope": "item", "op": "bucketize", "input": "p", "rows": 8, "boundaries": [3, 2]}
            ),
            "field 'b': boundaries must be strictly increasing",
        ),
        (
            lambda r: r["fields"].append({"name": "b", "scope": "item", "op": "bucketize", "input": "p", "rows": 8}),
            "field 'b': op 'bucketize' needs 'boundaries'",
        ),
        (
            lambda r: r["fields"].append(
                {"name": "lb", "scope": "item", "op": "log_bucket", "input": "p", "rows": 8, "base": 1}
            ),
            "field 'lb': log_bucket base must be a number > 1",
        ),
        (lambda r: r["model"].update(hash="md5"), "model.hash"),
        (lambda r: r["model"].update(embedding_dim=0), "model.embedding_dim"),
        (lambda r: r.pop("label"), "'label'"),
        (lambda r: r.update(extra=1), "unknown top-level key"),
        (lambda r: r["fields"][0].update(scope="cross"), "field 'user': a raw-column op"),
    ],
)
def test_validation_errors_name_field_and_problem(fn, msg):
    with pytest.raises(SpecError) as e:
        parse_spec(mutate(fn))
    assert msg in str(e.value)


def test_load_spec_reports_file_and_yaml_error(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: {embedding_dim: [\n")
    with pytest.raises(SpecError, match="bad.yaml: not valid YAML"):
        load_spec(p)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.yaml")


@pytest.mark.parametrize("name", ["movielens", "criteo", "frappe"])
def test_example_specs_load(name):
    spec = load_spec(REPO / "examples" / f"{name}.yaml")
    assert spec.fields and spec.model.embedding_dim == 16
