"""Helpers of the streaming updater tests: a tiny real export, delta files, an independent
last-write-wins state, spool listings."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
NAME = "tiny"
DIM = 8
ROWS = np.array([20000, 8000, 500])


def train_tiny(root: Path) -> Path:
    """A 3-field DeepFM (tables of ROWS rows, D = DIM) trained 1 epoch on a synthetic table; the run dir."""
    import pyarrow as pa

    from offgraph.features.spec import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    spec = parse_spec(
        {
            "model": {"embedding_dim": DIM, "mlp": [8]},
            "label": "label",
            "fields": [
                {"name": "user", "scope": "request", "op": "id", "input": "user", "rows": int(ROWS[0])},
                {"name": "item", "scope": "item", "op": "id", "input": "item", "rows": int(ROWS[1])},
                {"name": "cat", "scope": "item", "op": "id", "input": "cat", "rows": int(ROWS[2])},
            ],
        }
    )
    rng = np.random.default_rng(0)
    n = 1000
    table = pa.table(
        {
            "user": rng.integers(0, 300, n),
            "item": rng.integers(0, 200, n),
            "cat": rng.integers(0, 10, n),
            "label": rng.integers(0, 2, n),
        }
    )
    train_run(spec, table, TrainConfig(epochs=1, split="random", batch_size=1024), root / "run", progress=False)
    return root / "run"


def export_tiny(run: Path, out: Path, quant: str, shards: int = 4) -> Path:
    """Export ``run`` to ``out`` (a MODELS/tiny/VERSION directory)."""
    from offgraph.export.export import export_run

    export_run(run, out, shards=shards, quant=quant, progress=False)
    return out


def install_version(src: Path, models: Path, version: int) -> Path:
    """Copy an exported version into MODELS/tiny/VERSION, manifest last (as the exporter does)."""
    dst = models / NAME / str(version)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("manifest.json"))
    shutil.copy(src / "manifest.json", dst / "manifest.json.tmp")
    os.replace(dst / "manifest.json.tmp", dst / "manifest.json")
    return dst


def make_deltas(rng, k, *, seq0, tables=None, hot=None):
    """``k`` random deltas (kwargs of ``write_delta_file``) with seqs ``seq0, seq0 + 1, ...``."""
    t = rng.integers(0, 3, k).astype(np.uint32) if tables is None else np.full(k, tables, np.uint32)
    r = (rng.random(k) * (ROWS[t] if hot is None else np.minimum(ROWS[t], hot))).astype(np.int64)
    return dict(
        table_ids=t,
        rows=r,
        vectors=rng.standard_normal((k, DIM)).astype(np.float32),
        first_order=rng.standard_normal(k).astype(np.float32),
        seqs=seq0 + np.arange(k),
        event_time_ms=int(time.time() * 1000),
    )


def publish(spool, version, d, model=NAME):
    from offgraph.streaming.deltas import publish_delta

    return publish_delta(spool, model=model, model_version=version, fsync=False, **d)


def last_write_wins(deltas):
    """Expected final (table, row) -> delta of the highest seq (equal seqs: the first in
    ``deltas`` order, i.e. the first applied), computed independently of the updater:
    ``(tables, rows, seqs, vectors, first_order)`` sorted by (table, row)."""
    t = np.concatenate([d["table_ids"] for d in deltas]).astype(np.int64)
    r = np.concatenate([d["rows"] for d in deltas])
    s = np.concatenate([d["seqs"] for d in deltas])
    v = np.concatenate([d["vectors"] for d in deltas])
    w = np.concatenate([d["first_order"] for d in deltas])
    order = np.lexsort((-np.arange(len(r)), s, r, t))
    t, r, s, v, w = t[order], r[order], s[order], v[order], w[order]
    last = np.append((t[1:] != t[:-1]) | (r[1:] != r[:-1]), True)
    return t[last], r[last], s[last], v[last], w[last]


def open_version_store(vdir, mode="r"):
    from offgraph.store import open_store

    return open_store(vdir / "store", mode=mode)


def assert_store_holds(vdir, deltas) -> None:
    """The version's store holds the last-write-wins state of ``deltas``: seqs, vectors, first-order weights."""
    import numpy as np

    et, er, es, ev, ew = last_write_wins(deltas)
    with open_version_store(vdir) as st:
        np.testing.assert_array_equal(st.row_seqs(et, er), es)
        v, w = st.read(et, er)
        np.testing.assert_array_equal(v, ev)
        np.testing.assert_array_equal(w, ew)


def spool_files(d: Path):
    return sorted(p.name for p in d.glob("*.delta.arrow")) if d.exists() else []


def updater(models, spool, **kw):
    """An in-process Updater of MODELS/tiny over ``spool:SPOOL``."""
    from offgraph.streaming.sources import open_source
    from offgraph.streaming.updater import Updater

    return Updater(models, NAME, open_source(f"spool:{spool}"), poll_interval_s=0.01, **kw)


def update_cmd(models, spool, *args) -> list[str]:
    """``offgraph update`` of MODELS/tiny over ``spool:SPOOL`` as a subprocess command line."""
    return [
        sys.executable,
        "-m",
        "offgraph.cli",
        "update",
        "--models",
        str(models),
        "--model",
        NAME,
        "--source",
        f"spool:{spool}",
        *args,
    ]


def run_update(models, spool, *args, timeout=300, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run(
        update_cmd(models, spool, *args), cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, **kw
    )


def kill_at_a_random_point(proc, mode: int, rnd, opened, progressed) -> bool:
    """SIGKILL the updater ``proc`` at a random point of ``mode``: 0 anywhere from its start (0.2-4 s:
    imports, opening the store, recovery, batches), 1 just after ``opened()`` turns true (the store
    opened: seek, tidying, per-shard catch-up), 2 just after ``progressed()`` does (mid-apply).
    True if it was killed, False if it had ended by itself; it has ended either way."""
    t_end = time.monotonic() + (rnd.uniform(0.2, 4.0) if mode == 0 else 60)
    while proc.poll() is None and time.monotonic() < t_end:
        if (mode == 1 and opened()) or (mode == 2 and progressed()):
            time.sleep(rnd.uniform(0.0, 0.2 if mode == 1 else 0.4))
            break
        time.sleep(0.01)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return killed


def mount_tmpfs(d, size: str) -> None:
    """Mount a tmpfs of ``size`` (e.g. "24m") at ``d`` (created if needed): the disk-full tests fill it.
    Root only: elsewhere the test is skipped, saying why; the caller unmounts it (``umount -l``)."""
    import pytest

    d.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {p.stderr.strip()}")


def keras_step_gradients(run_dir, table, loss: str = "pointwise") -> dict:
    """Gradient of the stream trainer's loss of ONE batch (``table``: pointwise, sum_i BCE(label_i, logit_i); a loss
    over lists, ``make_loss_fn(loss)`` over the rows of each value of the run spec's group, in the table's order, times
    the number of lists) w.r.t. every table row and the head's bias, by the FULL Keras model (its own lookup, pooling
    front and head, numeric input included): {combined key: (grad_vector, grad_weight)} and "bias": grad_bias."""
    import tensorflow as tf

    from offgraph.model.inputs import encode_table, finish_dense
    from offgraph.model.losses import is_listwise, make_loss_fn
    from offgraph.model.model import load_run
    from offgraph.store.keys import combine_keys

    model, run_spec, _ = load_run(run_dir)
    data = encode_table(run_spec, table)  # the run's spec: with its numeric fields' standardize statistics
    if run_spec.numeric:
        finish_dense(run_spec, data)
    x = {k: tf.constant(v) for k, v in data.x.items()}
    variables = [t.embeddings for t in model.front.emb_tables] + [t.embeddings for t in model.front.w_tables]
    variables.append(model.head.bias)
    if is_listwise(loss):
        _, first, lists = np.unique(data.groups, return_index=True, return_inverse=True)
        lists = np.argsort(np.argsort(first))[lists]  # numbered by first appearance, as the trainer does
    else:
        lists = np.zeros(len(data.labels), np.int64)
    with tf.GradientTape() as tape:
        logits, _ = model.logit_and_l2(x)
        units = int(lists.max()) + 1 if is_listwise(loss) else len(data.labels)
        value = make_loss_fn(loss)(tf.constant(data.labels), logits, tf.constant(lists, tf.int32)) * units
    grads = tape.gradient(value, variables)
    F = len(run_spec.fields)
    out: dict = {}
    for f in range(F):
        gv = tf.convert_to_tensor(grads[f]).numpy()
        gw = tf.convert_to_tensor(grads[F + f]).numpy()[:, 0]
        ids = data.x[f"ids_{f}"][data.x[f"mask_{f}"] > 0]
        for r in np.unique(ids).tolist():
            out[int(combine_keys(f, [r])[0])] = (gv[r], gw[r])
    out["bias"] = float(grads[-1])
    return out


def without_bias(d):
    """(a delta batch's rows but the bias row, the bias row's offset or None: offgraph.store.keys.BIAS_TABLE)."""
    from offgraph.store.keys import BIAS_TABLE

    bias = d.table_ids == BIAS_TABLE
    offset = float(d.first_order[bias][0]) if bias.any() else None
    keep = ~bias
    parts = (d.table_ids, d.rows, d.vectors, d.first_order, d.seqs, d.event_time_ms)
    return d.__class__(d.model, d.model_version, d.dim, *(a[keep] for a in parts)), offset
