"""The stream trainer keeps the model's semantics (issue 54, item 4): the reference design's example model, with
its numeric ``ctr_7d`` field, streams with the same row updates as a Keras step on the same events and a bias that
moves, and the server adds that bias; a model trained with a loss over lists streams with that loss over the
events' lists; what cannot be kept is refused by name."""

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from fg_samples import REFERENCE_FIELDS
from streaming_helpers import keras_step_gradients, without_bias

from offgraph.export.check import requests_from_rows
from offgraph.export.export import export_run
from offgraph.features import parse_spec
from offgraph.model.train import TrainConfig, train_run
from offgraph.scoring.scorer import Scorer
from offgraph.store import open_store
from offgraph.store.keys import BIAS_TABLE, combine_keys
from offgraph.streaming.deltas import read as read_delta_file
from offgraph.streaming.sinks import open_sink
from offgraph.streaming.sources import open_source
from offgraph.streaming.stream_train import StreamTrainConfig, open_trainer, stream_train_table
from offgraph.streaming.updater import Updater
from offgraph.streaming.updater_config import UpdaterConfig

pytestmark = pytest.mark.timeout(600)

# the reference design's worked example, with the README's ctr_7d transform
FIELDS = [
    {**f, "transform": ["clip", "log1p", "standardize"], "clip": [0, 1]} if f["name"] == "ctr_7d" else f
    for f in REFERENCE_FIELDS
]
QUERIES = ["跑鞋", "篮球鞋", "男士透气跑鞋", "女鞋", "运动 nike"]
TITLES = [["男", "跑", "鞋", "透气"], ["篮球", "鞋"], ["女", "鞋"], ["nike", "跑", "鞋"], ["袜子"]]


def _ads_events(n: int, seed: int, lists: int = 0) -> pa.Table:
    """Synthetic search-ad impressions in the reference's columns; a click is likelier with a higher ctr_7d and a
    query term in the title. ``lists`` > 0: impressions come in requests of that many ads (request_id)."""
    rng = np.random.default_rng(seed)
    per = max(lists, 1)
    req = np.repeat(np.arange(n // per), per)[:n]
    m = int(req.max()) + 1
    user = rng.integers(0, 300, m)[req]
    q = rng.integers(0, len(QUERIES), m)[req]
    t = rng.integers(0, len(TITLES), n)
    ctr = rng.beta(1, 30, n)
    match = np.array([any(c in QUERIES[a] for c in TITLES[b]) for a, b in zip(q, t)])
    logit = -2.0 + 25 * ctr + 1.2 * match + rng.normal(0, 0.5, n)
    return pa.table(
        {
            "user_id": [f"u{u}" for u in user],
            "query": [QUERIES[i] for i in q],
            "hour": rng.integers(0, 24, m)[req].tolist(),
            "gender": np.where(rng.random(m) < 0.5, "男", "女")[req].tolist(),
            "ad_id": rng.integers(9000, 9400, n).tolist(),
            "category": rng.integers(0, 40, n).tolist(),
            "price": rng.lognormal(6, 1, n).round().tolist(),
            "title": [TITLES[i] for i in t],
            "ctr_7d": ctr.tolist(),
            "click": (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64).tolist(),
            "request_id": [f"r{r}" for r in req],
            "ts": (1_700_000_000 + np.arange(n) // per).tolist(),
        }
    )


def _spec(group: bool = False):
    return parse_spec(
        {
            "model": {"embedding_dim": 8, "mlp": [8]},
            "label": "click",
            "time": "ts",
            **({"group": "request_id"} if group else {}),
            "fields": FIELDS,
        },
        source="reference example",
    )


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    """The reference example model trained 1 epoch on 3,000 impressions, exported fp32 (models/ads/1)."""
    root = tmp_path_factory.mktemp("ref")
    spec = _spec()
    train_run(spec, _ads_events(3000, 0), TrainConfig(epochs=1, batch_size=256), root / "run", progress=False)
    export_run(root / "run", root / "models" / "ads" / "1", shards=2, quant="fp32", progress=False)
    return {"spec": spec, "run": root / "run", "version": root / "models" / "ads" / "1", "models": root / "models"}


def _one_delta(spool: Path):
    (path,) = sorted(spool.glob("*.delta.arrow"))
    return read_delta_file(path)


@pytest.mark.parametrize("source", ["model", "run"])
def test_reference_model_with_ctr_7d_streams_like_a_keras_step_and_its_bias_moves(ref, tmp_path, source):
    lr = 0.1
    events = _ads_events(40, 7)
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    kw = {"model_dir": ref["version"]} if source == "model" else {"run_dir": ref["run"], "model_name": "ads"}
    kw |= {} if source == "model" else {"model_version": 1}
    with open_trainer(config=StreamTrainConfig(lr=lr, batch_size=64), **kw) as tr:  # ONE step on the 40 events
        stream_train_table(tr, events, spool, progress=False)
    d, offset = without_bias(_one_delta(spool))
    with open_store(ref["version"] / "store") as st:
        old_v, old_w, found = st.read_unique(d.table_ids, d.rows)
    assert found.all()
    want = keras_step_gradients(ref["run"], events)
    g_bias = want.pop("bias")
    keys = combine_keys(d.table_ids, d.rows).tolist()
    assert set(keys) == set(want)  # exactly the rows Keras's step touches
    gv = np.stack([want[k][0] for k in keys])
    gw = np.array([want[k][1] for k in keys])
    assert np.abs(gv).max() > 1e-3 and np.abs(gw).max() > 1e-3
    np.testing.assert_allclose(d.vectors - old_v, -lr * gv, rtol=2e-3, atol=1e-7)
    np.testing.assert_allclose(d.first_order - old_w, -lr * gw, rtol=2e-3, atol=1e-7)
    # the bias moves, by Keras's step of the head's bias (the export wrote none: from 0)
    assert abs(g_bias) > 1e-2 and offset == pytest.approx(-lr * g_bias, rel=2e-3)


def test_the_bias_steps_with_the_embeddings_rate_not_the_first_order_one(ref, tmp_path):
    """Every event of a batch pushes the bias: by default it takes lr (small), not lr_first_order (large)."""
    lr, lr_w = 0.01, 0.5
    events = _ads_events(40, 7)
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    cfg = StreamTrainConfig(lr=lr, lr_first_order=lr_w, batch_size=64)  # ONE step
    with open_trainer(model_dir=ref["version"], config=cfg) as tr:
        stream_train_table(tr, events, spool, progress=False)
    _, offset = without_bias(_one_delta(spool))
    g_bias = keras_step_gradients(ref["run"], events)["bias"]
    assert abs(g_bias) > 1e-2 and offset == pytest.approx(-lr * g_bias, rel=2e-3)


def test_the_streamed_bias_reaches_the_served_scores(ref, tmp_path):
    """After `offgraph update` applies a stream's deltas, the scorer serves what the trainer predicts (rows AND
    bias); with the bias row taken out of the delta the scores differ by the bias."""
    import shutil

    models = tmp_path / "models"
    shutil.copytree(ref["models"], models)
    version = models / "ads" / "1"
    spec = ref["spec"]
    events, probe = _ads_events(200, 11), _ads_events(30, 12)
    cols = {c: probe.column(c).to_pylist() for c in probe.column_names}
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    with open_trainer(model_dir=version, config=StreamTrainConfig(lr=0.05, lr_first_order=0.5, lr_bias=0.5)) as tr:
        before = tr.predict(cols, probe.num_rows)
        stream_train_table(tr, events, spool, progress=False)
        after = tr.predict(cols, probe.num_rows)
        bias = tr.bias
    assert abs(bias) > 0.05  # 200 events at lr_bias 0.5 move it
    Updater(models, "ads", open_source(f"spool:{spool}"), UpdaterConfig()).run(once=True)
    served = np.zeros(probe.num_rows, np.float32)
    with Scorer(version) as sc:
        for req, cands, pos in requests_from_rows(spec, cols, np.arange(probe.num_rows)):
            served[pos] = sc.score(req, cands)
        with open_store(version / "store") as st:
            _, w, found = st.read_unique(np.array([BIAS_TABLE], np.uint32), np.array([0]))
    assert found.all() and w[0] == pytest.approx(bias, rel=1e-6)
    np.testing.assert_allclose(served, after, rtol=1e-5, atol=1e-6)
    assert np.abs(served - before).max() > 1e-3
    # the same rows without the bias: each score's logit is the bias lower
    logit = np.log(served) - np.log1p(-served)
    unbiased = 1 / (1 + np.exp(-(logit - bias)))
    assert np.all(np.sign(served - unbiased) == np.sign(bias))


@pytest.fixture(scope="module")
def listwise(tmp_path_factory):
    """The reference example trained with the listwise loss on requests of 8 ads, no calibration fitted
    (no validation rows: its scores are ranking scores), exported fp32 (models/ads/1)."""
    root = tmp_path_factory.mktemp("listwise")
    spec = _spec(group=True)
    cfg = TrainConfig(epochs=1, batch_size=256, loss="listwise", validation=0.0)
    train_run(spec, _ads_events(4000, 1, lists=8), cfg, root / "run", progress=False)
    export_run(root / "run", root / "models" / "ads" / "1", shards=2, quant="fp32", progress=False)
    return {"spec": spec, "run": root / "run", "version": root / "models" / "ads" / "1"}


def test_a_listwise_model_streams_with_its_loss_over_the_events_lists(listwise, tmp_path):
    lr = 0.1
    events = _ads_events(48, 5, lists=8)  # 6 requests
    events = events.take(pa.array(np.random.default_rng(0).permutation(48)))  # lists interleaved: the trainer groups
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    with open_trainer(model_dir=listwise["version"], config=StreamTrainConfig(lr=lr, batch_size=64)) as tr:
        assert tr.loss == "listwise"
        s = stream_train_table(tr, events, spool, progress=False)
    assert s["loss"] == "listwise" and s["events"] == 48
    # progressive NDCG@10 over the 6 lists, each scored before its step: graded gains 2^g - 1, by hand
    y, p = tr.progressive_predictions()
    lists = np.repeat(np.arange(6), 8)  # the trainer's order: whole lists of 8, by their first event
    ndcgs = []
    for g in range(6):
        yy, pp = y[lists == g], p[lists == g]
        if yy.max() > 0:
            disc = 1 / np.log2(np.arange(2, len(yy) + 2))
            ndcgs.append(
                ((2 ** yy[np.argsort(-pp, kind="stable")] - 1) * disc).sum()
                / ((2 ** np.sort(yy)[::-1] - 1) * disc).sum()
            )
    assert s["progressive_ndcg@10"] == pytest.approx(np.mean(ndcgs), abs=1e-6)
    d, offset = without_bias(_one_delta(spool))
    assert offset is None  # a softmax over each list has no gradient for a shift of every score: no bias row
    with open_store(listwise["version"] / "store") as st:
        old_v, old_w, _ = st.read_unique(d.table_ids, d.rows)
    # Keras's listwise loss over the same 6 lists (in the trainer's order: by first event in time order)
    ordered = events.take(pa.array(np.argsort(events.column("ts").to_numpy(), kind="stable")))
    want = keras_step_gradients(listwise["run"], ordered, loss="listwise")
    assert want.pop("bias") == pytest.approx(0.0, abs=1e-5)
    keys = combine_keys(d.table_ids, d.rows).tolist()
    moved = {k for k, (gv, gw) in want.items() if np.abs(gv).max() > 0 or gw != 0}
    assert set(keys) >= moved and len(moved) > 10
    gv = np.stack([want[k][0] for k in keys])
    gw = np.array([want[k][1] for k in keys])
    np.testing.assert_allclose(d.vectors - old_v, -lr * gv, rtol=2e-3, atol=1e-7)
    np.testing.assert_allclose(d.first_order - old_w, -lr * gw, rtol=2e-3, atol=1e-7)


def test_what_cannot_be_kept_is_refused_by_name(listwise, ref, tmp_path):
    spool = open_sink(f"spool:{tmp_path / 'spool'}").dir
    # a listwise model's events without the group column: no lists to take the loss over
    with open_trainer(model_dir=listwise["version"]) as tr:
        with pytest.raises(ValueError, match=r"group column 'request_id'"):
            stream_train_table(tr, _ads_events(16, 3, lists=8).drop_columns(["request_id"]), spool, progress=False)
        graded = _ads_events(16, 3, lists=8)
        bad = graded.set_column(graded.column_names.index("click"), "click", pa.array([-1] + [0] * 15))
        with pytest.raises(ValueError, match=r"label 'click' must be a grade >= 0"):
            stream_train_table(tr, bad, spool, progress=False)
    # a listwise model whose scores are CTRs through a Platt fit of the exported scores: streaming would stale it
    root = tmp_path / "platt"
    raw = {**_spec(group=True).to_dict()}
    raw["model"] = {**raw["model"], "calibration": {"logit_scale": 1.5, "logit_shift": -1.0}}  # declared, as fitted
    spec = parse_spec(raw, source="listwise with Platt")
    cfg = TrainConfig(epochs=1, batch_size=256, loss="listwise", validation=0.0)
    train_run(spec, _ads_events(800, 2, lists=8), cfg, root / "run", progress=False)
    with pytest.raises(ValueError, match=r"Platt calibration fitted to the exported model's scores"):
        open_trainer(run_dir=root / "run", model_name="ads", model_version=1)
    # the pointwise reference model: a label other than 0/1 is refused, naming it
    with open_trainer(model_dir=ref["version"]) as tr:
        ev = _ads_events(8, 4)
        bad = ev.set_column(ev.column_names.index("click"), "click", pa.array([2] + [0] * 7))
        with pytest.raises(ValueError, match=r"label 'click' must be 0 or 1"):
            stream_train_table(tr, bad, spool, progress=False)
