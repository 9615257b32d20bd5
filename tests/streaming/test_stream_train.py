"""The incremental trainer on a real (tiny) exported model: real RocksDB store, real SavedModel."""

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from streaming_helpers import keras_step_gradients, without_bias

from offgraph.export.check import requests_from_rows
from offgraph.export.export import export_run
from offgraph.features import FeatureGenerator, load_spec
from offgraph.model.train import TrainConfig, train_run
from offgraph.scoring.batch import batch_keys
from offgraph.scoring.scorer import Scorer
from offgraph.store import open_store
from offgraph.store.keys import BIAS_TABLE, combine_keys, split_keys
from offgraph.streaming._stream_train import LocalRows
from offgraph.streaming.deltas import read as read_delta_file
from offgraph.streaming.sinks import open_sink
from offgraph.streaming.stream_train import StreamTrainConfig, open_trainer, stream_train_table

REPO = Path(__file__).resolve().parents[2]
TRAIN_ROWS = 4000


@pytest.fixture(scope="module")
def tiny(movielens_table, tmp_path_factory):
    """A 1-epoch DeepFM on the first MovieLens rows, exported fp32 x 2 shards to models/ml/1."""
    root = tmp_path_factory.mktemp("stream")
    spec = load_spec(REPO / "examples" / "movielens.yaml")
    train_run(spec, movielens_table.slice(0, TRAIN_ROWS), TrainConfig(epochs=1), root / "run", progress=False)
    export_run(root / "run", root / "models" / "ml" / "1", shards=2, quant="fp32", progress=False)
    return {
        "root": root,
        "run": root / "run",
        "version": root / "models" / "ml" / "1",
        "spec": spec,
        "events": movielens_table.slice(TRAIN_ROWS, 2000),
    }


def _keys_of(spec, table: pa.Table) -> set:
    """(table, row) keys the events look up, through the shared FG."""
    cols = {c: table.column(c).to_pylist() for c in {f.input for f in spec.fields if f.input}}
    k = batch_keys(FeatureGenerator(spec).transform_columns(cols, table.num_rows))
    return set(combine_keys(k.unique_tables, k.unique_rows).tolist())


def _deltas(spool) -> list:
    return [read_delta_file(p) for p in sorted(spool.glob("*.delta.arrow"))]


@pytest.mark.parametrize("source", ["model", "run"])
def test_sgd_step_is_minus_lr_times_the_keras_gradient(tiny, tmp_path, source):
    spec, lr = tiny["spec"], 0.1
    events = tiny["events"].slice(0, 24)  # several users, multi-valued genres / title words, repeated rows
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    cfg = StreamTrainConfig(lr=lr, optimizer="sgd", batch_size=64)  # ONE step on all 24 events
    kw = (
        {"model_dir": tiny["version"]}
        if source == "model"
        else {"run_dir": tiny["run"], "model_name": "ml", "model_version": 1}
    )
    with open_trainer(config=cfg, **kw) as tr:
        s = stream_train_table(tr, events, spool, progress=False)
    assert s["events"] == 24 and s["files_emitted"] == 1
    (d,) = _deltas(spool)
    d, offset = without_bias(d)
    with open_store(tiny["version"] / "store") as st:  # fp32: exactly the Keras tables
        old_v, old_w, found = st.read_unique(d.table_ids, d.rows)
    assert found.all()
    want = keras_step_gradients(tiny["run"], events)
    want_bias = want["bias"]
    # the bias moves as Keras's would (from offset 0: the export writes no bias row), lr_w = lr
    assert abs(want.pop("bias")) > 1e-3 and offset == pytest.approx(-lr * want_bias, rel=2e-3)
    keys = combine_keys(d.table_ids, d.rows).tolist()
    assert set(keys) == set(want) == _keys_of(spec, events)  # exactly the touched rows
    gv = np.stack([want[k][0] for k in keys])
    gw = np.array([want[k][1] for k in keys])
    assert np.abs(gv).max() > 1e-3 and np.abs(gw).max() > 1e-3  # a real gradient, not zeros
    np.testing.assert_allclose(d.vectors - old_v, -lr * gv, rtol=2e-3, atol=1e-7)
    np.testing.assert_allclose(d.first_order - old_w, -lr * gw, rtol=2e-3, atol=1e-7)


def test_cli_emits_files_of_touched_rows_with_increasing_seqs(tiny, tmp_path):
    import offgraph.cli

    spec = tiny["spec"]
    events = tiny["events"].slice(100, 12)
    events = events.take(pa.array(np.arange(12)[::-1]))  # newest first: the trainer must sort
    t = events.column("timestamp").to_numpy()
    assert len(np.unique(t)) > 3 and (np.diff(t) <= 0).all() and t[0] > t[-1]
    path = tmp_path / "events.parquet"
    pq.write_table(events, path)
    rc = offgraph.cli.main(
        [
            "stream-train",
            "--model",
            str(tiny["version"].parent),
            "--events",
            str(path),
            "--emit",
            f"spool:{tmp_path / 'spool'}",
            "--every-events",
            "5",
            "--seq-start",
            "1000",
            "--lr",
            "0.05",
            "--no-progress",
        ]
    )
    assert rc == 0
    files = _deltas(tmp_path / "spool")
    assert [len(set(combine_keys(f.table_ids, f.rows).tolist())) for f in files] == [len(f) for f in files]
    order = np.argsort(t, kind="stable")
    chunks = [order[0:5], order[5:10], order[10:12]]
    assert len(files) == 3
    last_seq = 999
    for f, idx in zip(files, chunks):
        chunk = events.take(pa.array(idx))
        assert (f.model, f.model_version, f.dim) == ("ml", 1, spec.model.embedding_dim)
        bias_key = int(combine_keys(BIAS_TABLE, [0])[0])  # each batch moved the bias too: its row, last
        assert set(combine_keys(f.table_ids, f.rows).tolist()) == _keys_of(spec, chunk) | {bias_key}
        assert int(combine_keys(f.table_ids[-1:], f.rows[-1:])[0]) == bias_key
        assert f.seqs[0] == last_seq + 1 and (np.diff(f.seqs) == 1).all()
        last_seq = int(f.seqs[-1])
        assert f.event_time_ms.max() == chunk.column("timestamp").to_numpy().max() * 1000
        assert f.event_time_ms.min() >= chunk.column("timestamp").to_numpy().min() * 1000
        assert np.isfinite(f.vectors).all()


def test_cli_json_summary_is_strict_json_with_null_for_an_undefined_auc(tiny, tmp_path):
    """Events of one class: the progressive AUC is undefined, and --json writes null (not the token NaN)."""
    import json

    import pyarrow.compute as pc

    import offgraph.cli

    events = tiny["events"]
    events = events.filter(pc.equal(events.column(tiny["spec"].label), 1)).slice(0, 20)
    assert events.num_rows == 20
    path = tmp_path / "events.parquet"
    pq.write_table(events, path)
    out = tmp_path / "summary.json"
    rc = offgraph.cli.main(
        [
            "stream-train",
            "--model",
            str(tiny["version"].parent),
            "--events",
            str(path),
            "--emit",
            f"spool:{tmp_path / 'spool'}",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 0

    def refuse(token):
        raise ValueError(f"not JSON: {token}")

    summary = json.loads(out.read_text(), parse_constant=refuse)  # NaN / Infinity tokens are refused
    assert summary["progressive_auc"] is None and summary["events"] == 20, summary
    assert isinstance(summary["progressive_logloss"], float) and summary["progressive_logloss"] > 0, summary


def test_strict_json_maps_every_non_finite_value_to_null():
    from offgraph.streaming.strict_json import dumps

    text = dumps(
        {
            "a": float("nan"),
            "b": [np.float32("inf"), -np.inf, 1.5, np.int64(3)],
            "c": np.array([np.nan, 2.0]),
            "d": (float("-inf"),),
            "e": "NaN",
        }
    )
    assert text == '{"a": null, "b": [null, null, 1.5, 3], "c": [null, 2.0], "d": [null], "e": "NaN"}'


def test_positive_events_raise_the_items_score_for_those_users(tiny, tmp_path):
    spec = tiny["spec"]
    ev = tiny["events"]
    movie = ev.column("movie_id").to_pylist()[0]
    item_row = ev.filter(pa.compute.equal(ev.column("movie_id"), movie)).slice(0, 1)
    _, first = np.unique(ev.column("user_id").to_numpy(), return_index=True)
    rows = ev.take(pa.array(np.sort(first)[:12]))  # 12 users, one row each
    # those users, each with the one movie, all positive
    cols = {c: rows.column(c).to_pylist() for c in rows.column_names}
    for c in spec.raw_inputs("item"):
        cols[c] = item_row.column(c).to_pylist() * rows.num_rows
    cols["label"] = [1] * rows.num_rows
    events = pa.table(cols)

    copy = tmp_path / "models" / "ml" / "1"
    shutil.copytree(tiny["version"], copy)
    columns = {c: events.column(c).to_pylist() for c in events.column_names}

    def scores(version_dir):
        out = np.zeros(events.num_rows, np.float32)
        with Scorer(version_dir) as sc:
            for req, cands, pos in requests_from_rows(spec, columns, np.arange(events.num_rows)):
                out[pos] = sc.score(req, cands)
        return out

    before = scores(copy)
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    with open_trainer(model_dir=copy, config=StreamTrainConfig(lr=0.05, batch_size=64)) as tr:
        stream_train_table(tr, events, spool, progress=False)
    with open_store(copy / "store", mode="w") as st:
        for d in _deltas(spool):
            st.write(d.table_ids, d.rows, d.vectors, d.first_order)
    after = scores(copy)
    assert (after > before).all(), (before, after)
    assert (after - before).mean() > 0.01, (before, after)
    np.testing.assert_array_equal(scores(tiny["version"]), before)  # the original store is untouched


def test_trainer_predicts_what_the_scorer_serves_and_fields_limit_the_deltas(tiny, tmp_path):
    spec = tiny["spec"]
    events = tiny["events"].slice(300, 40)
    columns = {c: events.column(c).to_pylist() for c in events.column_names}
    served = np.zeros(events.num_rows, np.float32)
    with Scorer(tiny["version"]) as sc:
        for req, cands, pos in requests_from_rows(spec, columns, np.arange(events.num_rows)):
            served[pos] = sc.score(req, cands)
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    cfg = StreamTrainConfig(lr=0.05, lr_first_order=0.2, fields=("user_id", "movie_id"), train_bias=False)
    with open_trainer(model_dir=tiny["version"], config=cfg) as tr:
        np.testing.assert_allclose(tr.predict(columns, events.num_rows), served, rtol=1e-5, atol=1e-6)
        stream_train_table(tr, events, spool, progress=False)
        assert tr.rows.n_trained < len(tr.rows)  # rows of the other fields were read, not trained
    (d,) = _deltas(spool)
    want = {spec.field_index("user_id"), spec.field_index("movie_id")}
    assert set(d.table_ids.tolist()) == want  # no bias row either: --no-train-bias
    assert len(d) == len({k for k in _keys_of(spec, events) if int(split_keys([k])[0][0]) in want})
    with pytest.raises(ValueError, match="unknown field"):
        open_trainer(model_dir=tiny["version"], config=StreamTrainConfig(fields=("nope",)))


def test_adagrad_step_is_rowwise_and_bounded(tiny, tmp_path):
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    lr, init = 0.01, 0.0
    cfg = StreamTrainConfig(lr=lr, optimizer="adagrad", adagrad_init=init, adagrad_eps=1e-12, batch_size=64)
    events = tiny["events"].slice(0, 24)
    with open_trainer(model_dir=tiny["version"], config=cfg) as tr:
        stream_train_table(tr, events, spool, progress=False)
    (d,) = _deltas(spool)
    d, offset = without_bias(d)
    assert offset is not None and abs(offset) == pytest.approx(lr, rel=1e-3)  # the bias: a weight, from 0
    with open_store(tiny["version"] / "store") as st:
        old_v, old_w, _ = st.read_unique(d.table_ids, d.rows)
    # first step from a zero accumulator: |dw| = lr, and the RMS of dv over a row = lr
    dv, dw = d.vectors - old_v, d.first_order - old_w
    np.testing.assert_allclose(np.abs(dw), lr, rtol=1e-3)
    np.testing.assert_allclose(np.sqrt(np.mean(dv * dv, axis=1)), lr, rtol=1e-3)


def test_local_rows_lookup_across_merges():
    rows = LocalRows(dim=2)
    rng = np.random.default_rng(0)
    keys = rng.choice(2**40, size=20000, replace=False).astype(np.uint64)
    for part in np.array_split(keys, 13):
        rows.add(part, np.zeros((len(part), 2), np.float32), np.zeros(len(part), np.float32))
    slots = rows.lookup(keys)
    assert (slots == np.arange(len(keys))).all()
    assert (rows.lookup(np.array([2**41, 2**41 + 7], np.uint64)) == -1).all()


def test_bad_arguments_are_named(tiny, tmp_path):
    with pytest.raises(ValueError, match="expected spool:DIR or kafka://HOST:PORT/TOPIC"):
        open_sink(f"kafka:{tmp_path}")
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        open_sink("kafka://nohost/topic")
    with pytest.raises(ValueError, match="--model-name and --model-version"):
        open_trainer(run_dir=tiny["run"])
    with pytest.raises(ValueError, match=r"StreamTrainConfig.optimizer \(--optimizer\) must be 'sgd' or 'adagrad'"):
        open_trainer(model_dir=tiny["version"], config=StreamTrainConfig(optimizer="adam"))
    bad = (
        tiny["events"]
        .slice(0, 4)
        .set_column(tiny["events"].column_names.index("label"), "label", pa.array([0, 1, 2, 1]))
    )
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    with open_trainer(model_dir=tiny["version"]) as tr:
        with pytest.raises(ValueError, match="label 'label' must be 0 or 1"):
            stream_train_table(tr, bad, spool, progress=False)
