"""`offgraph train`'s defaults and early errors: the split follows the spec (per-key-time where it names
`time` and `split_key`, random otherwise) and the output says which and why; an explicit split the spec
cannot take, or a misspelt column, is refused before the rows are read; `--columns` takes ranges; each
epoch's printed time is its own."""

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from offgraph.cli import main

ROWS = 240
FIELDS = [
    {"name": "user", "scope": "request", "op": "id", "input": "user", "rows": 64},
    {"name": "weekday", "scope": "request", "op": "id", "input": "weekday", "rows": 16},
    {"name": "item", "scope": "item", "op": "id", "input": "item", "rows": 64},
]


def _spec(tmp_path, **top) -> str:
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"model": {"embedding_dim": 4, "mlp": [8]}, "label": "label", "fields": FIELDS, **top}))
    return str(p)


def _table() -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "label": rng.integers(0, 2, ROWS),
            "user": rng.integers(0, 12, ROWS),
            "weekday": rng.integers(0, 7, ROWS),
            "item": rng.integers(0, 30, ROWS),
            "ts": np.arange(ROWS),
        }
    )


def _unreadable_rows(tmp_path) -> str:
    """A Parquet file whose schema reads and whose rows do not (a check that passes it read no rows)."""
    p = tmp_path / "broken.parquet"
    pq.write_table(_table(), p, compression="none")
    offset = pq.read_metadata(p).row_group(0).column(0).data_page_offset
    data = bytearray(p.read_bytes())
    data[offset : offset + 64] = b"\xff" * 64
    p.write_bytes(bytes(data))
    return str(p)


def _train(tmp_path, spec, data, *more) -> list[str]:
    return ["train", "--spec", spec, "--data", data, "--out", str(tmp_path / "run"), "--no-progress", *more]


def test_an_explicit_per_key_time_split_without_its_columns_is_refused_at_once(tmp_path, capsys):
    spec = _spec(tmp_path)
    assert main(_train(tmp_path, spec, _unreadable_rows(tmp_path), "--split", "per-key-time")) == 2
    err = capsys.readouterr().err
    assert "split 'per-key-time' needs the spec's 'time' and 'split_key' columns" in err, err
    assert "pass --split random" in err, err
    assert main(_train(tmp_path, _spec(tmp_path, split_key="user"), _unreadable_rows(tmp_path), "--split", "time")) == 2
    assert "split 'time' needs the spec's 'time' columns, and the spec has no 'time'" in capsys.readouterr().err


def test_a_misspelt_column_is_told_before_the_rows_are_read(tmp_path, capsys):
    fields = [dict(FIELDS[0]), {**FIELDS[1], "input": "wekday"}, dict(FIELDS[2])]
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"label": "label", "fields": fields}))
    assert main(_train(tmp_path, str(p), _unreadable_rows(tmp_path))) == 2
    err = capsys.readouterr().err
    assert "no column 'wekday' (input of field 'weekday') (did you mean 'weekday'?)" in err, err


def test_without_time_and_split_key_the_split_is_random_and_said_so(tmp_path, capsys):
    """A headerless TSV read with --columns ranges; one epoch."""
    t = _table()
    cols = [t.column(c).to_pylist() for c in ("label", "user", "weekday", "item")]
    tsv = tmp_path / "t.tsv"
    tsv.write_text("".join("\t".join(str(v) for v in row) + "\n" for row in zip(*cols)))
    fields = [{**f, "input": f"f{i}"} for i, f in enumerate(FIELDS, start=1)]
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump({"model": {"embedding_dim": 4, "mlp": [8]}, "label": "label", "fields": fields}))
    assert main(_train(tmp_path, str(p), str(tsv), "--columns", "label,f1..f3", "--epochs", "1")) == 0
    out = capsys.readouterr().out
    assert "(random split: the spec has no 'time' and no 'split_key', which per-key-time needs)" in out, out
    assert json.loads((tmp_path / "run" / "train_config.json").read_text())["split"] == "random"


def test_with_time_and_split_key_the_split_is_per_key_time_and_epoch_times_are_each_epochs_own(tmp_path, capsys):
    data = tmp_path / "t.parquet"
    pq.write_table(_table(), data)
    spec = _spec(tmp_path, time="ts", split_key="user")
    assert main(_train(tmp_path, spec, str(data), "--epochs", "2", "--validation", "0")) == 0
    out = capsys.readouterr().out
    assert "(per-key-time split: the spec has time 'ts' and split_key 'user')" in out, out
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    seconds = [h["seconds"] for h in metrics["history"]]
    printed = [float(s) for s in re.findall(r"^epoch \d+: .*\((\d+\.\d)s\)$", out, re.M)]
    assert printed == [round(s, 1) for s in seconds], out
    # each epoch's own time: together they fit in the training time (cumulative ones would count epoch 1 twice)
    assert sum(seconds) <= metrics["train_seconds"], (seconds, metrics["train_seconds"])


def test_an_explicit_split_is_kept(tmp_path, capsys):
    data = tmp_path / "t.parquet"
    pq.write_table(_table(), data)
    spec = _spec(tmp_path, time="ts", split_key="user")
    assert main(_train(tmp_path, spec, str(data), "--epochs", "1", "--split", "random", "--validation", "0")) == 0
    assert "(random split: as asked)" in capsys.readouterr().out
