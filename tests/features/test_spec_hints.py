"""Spec errors that help: a did-you-mean for a misspelt op, key, parameter or scope; YAML errors naming the
file and the line; a field without `rows` told that `rows` is required."""

import copy

import pytest

from offgraph.features.spec import SpecError, load_spec, parse_spec
from offgraph.features.suggest import did_you_mean

BASE = {
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 100},
        {"name": "title", "scope": "item", "op": "tokenize", "input": "title", "rows": 100},
    ],
}


def _error(fn) -> str:
    raw = copy.deepcopy(BASE)
    fn(raw)
    with pytest.raises(SpecError) as e:
        parse_spec(raw)
    return str(e.value)


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda r: r["fields"][1].update(op="tokenise"), "unknown op 'tokenise' (did you mean 'tokenize'?)"),
        (lambda r: r.update(lable="y"), "unknown top-level key(s) ['lable' (did you mean 'label'"),
        (
            lambda r: r.update(model={"embeding_dim": 8}),
            "model: unknown key(s) ['embeding_dim' (did you mean 'embedding_dim'",
        ),
        (
            lambda r: r.update(model={"calibration": {"negativ_rate": 0.5}}),
            "model.calibration: unknown key(s) ['negativ_rate' (did you mean 'negative_rate'?)]",
        ),
        (
            lambda r: r["fields"][0].update(separatr="|"),
            "field 'user': unknown parameter(s) ['separatr' (did you mean 'separator'?)] for op 'id'",
        ),
        (lambda r: r["fields"][0].update(scope="requests"), "got 'requests' (did you mean 'request'?)"),
    ],
)
def test_a_misspelt_name_gets_a_did_you_mean(fn, words):
    assert words in _error(fn)


def test_no_hint_when_nothing_is_close():
    msg = _error(lambda r: r["fields"][0].update(op="zzz"))
    assert "unknown op 'zzz'; known ops:" in msg and "did you mean" not in msg
    assert did_you_mean(3, ["a"]) == ""


def test_a_missing_rows_says_rows_is_required():
    msg = _error(lambda r: r["fields"][1].pop("rows"))
    assert "field 'title': 'rows' is required" in msg and "None" not in msg
    assert "rows must be an integer >= 1, got 'many'" in _error(lambda r: r["fields"][1].update(rows="many"))


@pytest.mark.parametrize(
    "text, line",
    [
        ("label: x\nfields:\n  - {name: a, op: id\n  - b\n", "line 5"),  # an unclosed flow mapping
        ("label: x\n  fields: [\n", "line 2, column 9"),
        ("label: x\nfields:\n - name: a\n  op: id\n", "line 4, column 3"),
    ],
)
def test_a_yaml_error_names_the_file_and_the_line(tmp_path, text, line):
    p = tmp_path / "my_spec.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert msg.startswith(f"spec {p}: not valid YAML at {line}"), msg
    assert "<unicode string>" not in msg
