"""Training loop for DeepFM on a raw table: split, FG, tf.data, Adam/Adagrad, held-out metrics."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import tensorflow as tf
import yaml
from tqdm import tqdm

from offgraph.calibration import calibrate, platt, score_kind
from offgraph.features.segment import segmenters_of
from offgraph.features.spec import Calibration, FeatureSpec
from offgraph.model.curves import CURVES_FILE, write_curves
from offgraph.model.inputs import Encoded, encode_table, finish_dense, fit_numeric_stats, needs_stats
from offgraph.model.losses import PAIR_ROWS_MAX, LossFn, LossKey, is_listwise, loss_key, make_loss_fn, uses_pairs
from offgraph.model.losses import _parts as loss_parts  # a mixture's parts: one definition, in losses.py
from offgraph.model.metrics import higher_is_better, logloss, make_metric_fn, needs_groups
from offgraph.model.model import CONFIG_FILE, METRICS_FILE, SPEC_FILE, WEIGHTS_FILE, DeepFM, build_deepfm, predict_proba
from offgraph.model.platt import fit_platt
from offgraph.model.relevance import binarise
from offgraph.model.sparse_optimizer import LazyAdam
from offgraph.model.splits import held_out_mask
from offgraph.model.train_config import LOSSES, OPTIMIZERS, SCHEDULES, TrainConfig  # noqa: F401 (re-exported)

# the Keras object behind each name of train_config.OPTIMIZERS / SCHEDULES
OPTIMIZER_FACTORIES = {
    "adam": lambda lr: tf.keras.optimizers.Adam(lr),
    "lazy_adam": lambda lr: LazyAdam(lr),
    "adagrad": lambda lr: tf.keras.optimizers.Adagrad(lr, initial_accumulator_value=0.1),
}
SCHEDULE_FACTORIES = {
    "constant": lambda lr, steps: lr,
    "cosine": lambda lr, steps: tf.keras.optimizers.schedules.CosineDecay(lr, decay_steps=max(steps, 1)),
}
assert set(OPTIMIZER_FACTORIES) == set(OPTIMIZERS) and set(SCHEDULE_FACTORIES) == set(SCHEDULES)

# what evaluate reports, by name (offgraph.model.metrics), with the run's selection metric; those needing
# request groups where the rows have them
EVAL_METRICS = ("auc", "logloss", "ndcg@1", "ndcg@5", "ndcg@10", "map", "mrr", "arp")


def default_select(loss: str) -> str:
    """The validation metric that picks the epoch when ``--select`` is not given: AUC for the pointwise loss;
    NDCG@10 for a loss that compares a list's candidates (a softmax or a pair within one list says nothing
    about how its scores sit against another list's, so a global AUC is the wrong yardstick)."""
    return "ndcg@10" if is_listwise(loss) else "auc"


def selection_metric(cfg: TrainConfig) -> str:
    return cfg.select or default_select(cfg.loss)


class EpochSelection:
    """The best epoch by one validation metric (``higher_is_better`` says which way; a NaN, e.g. AUC of one
    class, is never better; the first epoch is the best until one beats it), and when to stop: after
    ``patience`` epochs without a better one."""

    def __init__(self, metric: str, patience: int):
        self.metric, self.patience, self._sign = metric, patience, 1.0 if higher_is_better(metric) else -1.0
        self.best_epoch, self.best_value, self._best_key = 0, float("nan"), -np.inf

    def update(self, epoch: int, validation: dict) -> tuple[bool, bool]:
        """(``epoch`` is the best so far, stop after it) given its validation metrics by name."""
        value = float(validation[self.metric])
        key = self._sign * value if np.isfinite(value) else -np.inf
        if self.best_epoch == 0 or key > self._best_key:
            self.best_epoch, self.best_value, self._best_key = epoch, value, key
            return True, False
        return False, epoch - self.best_epoch >= self.patience


def check_pair_rows(data: Encoded, cfg: TrainConfig) -> None:
    """A pairwise loss's batches fit its [n, n] matrices: a batch of whole lists holds fewer than ``batch_size``
    rows and then one more list of at most ``max_list_size`` rows (``list_batches``), so at most batch_size - 1 + the longest list."""
    _, sizes = np.unique(data.groups, return_counts=True)
    longest = min(int(sizes.max()) if len(sizes) else 0, cfg.max_list_size)  # a longer list is sampled
    if cfg.batch_size - 1 + longest > PAIR_ROWS_MAX:
        raise ValueError(
            f"loss {cfg.loss!r} compares the pairs of a batch, at most {PAIR_ROWS_MAX} rows: --batch-size "
            f"{cfg.batch_size} and lists of up to {longest} rows make batches of up to {cfg.batch_size - 1 + longest}"
            + (": lower --batch-size" if longest <= PAIR_ROWS_MAX else ": the longest list alone is too long")
        )


def training_objective(model: DeepFM, loss_fn: LossFn, l2_embedding: float, xb, yb, seg, training: bool = True):
    """(loss, loss + regularisation) of a batch: whichever the loss, the L2 penalty of the embedding rows the
    batch looks up (``l2_embedding`` x their sum of squares / the batch's rows) and the dense head's kernel
    penalties (``model.l2_dense``) are added to it."""
    logits, sq = model.logit_and_l2(xb, training=training)
    loss = loss_fn(yb, logits, seg)
    reg = l2_embedding * sq / tf.cast(tf.shape(yb)[0], tf.float32)
    if model.head.losses:
        reg += tf.add_n(model.head.losses)
    return loss, loss + reg


def _batches(data: Encoded, cfg: TrainConfig, rng: np.random.Generator, listwise: bool):
    """Yields (x, labels, segments): rows in a fresh random order each epoch (segments all 0), or, for a loss
    that compares a list's candidates, whole lists (``list_batches``). With ``cfg.negative_rate`` r < 1, each
    epoch trains on every positive row and a fresh sample of r of the negative ones."""
    if cfg.negative_rate < 1.0:
        kept = np.flatnonzero(binarise(data.labels) | (rng.random(data.n) < cfg.negative_rate))
        data = data.take(kept)
    if not listwise:
        order = rng.permutation(data.n)
        for s in range(0, data.n, cfg.batch_size):
            idx = order[s : s + cfg.batch_size]
            yield {k: v[idx] for k, v in data.x.items()}, data.labels[idx], np.zeros(len(idx), np.int32)
        return
    for idx, seg in list_batches(data.groups, data.labels, cfg.batch_size, cfg.max_list_size, rng, cfg.loss):
        yield {k: v[idx] for k, v in data.x.items()}, data.labels[idx], seg


def list_batches(
    groups: np.ndarray, labels: np.ndarray, batch_size: int, max_list_size: int, rng: np.random.Generator, loss: str
):
    """One epoch of a ranking loss's batches, as (row indices, segments 0..G-1 numbering each row's list in
    the batch). How the spec's ``group`` becomes the lists a loss sees, drawn afresh from ``rng`` each epoch:

    - a list is the rows of one group value;
    - its rows come in a random order (a loss or metric that breaks ties by position learns no row order);
    - a list of more than ``max_list_size`` rows is cut to a random ``max_list_size`` of them (a fresh sample
      each epoch, so every row is seen over the epochs; a rare relevant row may be out of one epoch's sample);
    - a list (as sampled) whose rows all share one grade, no relevant row included, has no order to learn: a
      purely ranking loss (no pointwise part: pairwise, lambdarank, listwise) leaves it out of the epoch; a
      mixture with a pointwise part keeps it for that part (its pairwise parts find no pair in it; listwise's
      part: nothing if it has no gain, else a uniform target);
    - the lists come in a random order, and a batch takes whole lists until it holds ``batch_size`` rows or
      more (so at most ``batch_size - 1 + max_list_size`` rows)."""
    n = len(labels)
    if n == 0:
        return
    shuffled = rng.permutation(n)
    _, gid = np.unique(groups[shuffled], return_inverse=True)
    rows = shuffled[np.argsort(gid, kind="stable")]  # grouped, each list in the shuffled order
    g = np.sort(gid)
    starts = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    sizes = np.diff(np.r_[starts, n])
    rank = np.arange(n) - np.repeat(starts, sizes)
    kept = rank < max_list_size  # the first max_list_size of a shuffled list: a uniform sample of it
    rows, g = rows[kept], g[kept]
    starts = np.r_[0, np.flatnonzero(np.diff(g)) + 1]
    sizes = np.diff(np.r_[starts, len(rows)])
    if not any(p == LossKey.POINTWISE for p in loss_parts(loss_key(loss))):
        y = labels[rows]
        varied = np.minimum.reduceat(y, starts) < np.maximum.reduceat(y, starts)
        starts, sizes = starts[varied], sizes[varied]
    perm = rng.permutation(len(starts))
    starts, sizes = starts[perm], sizes[perm]
    ends = np.cumsum(sizes)
    first = 0
    while first < len(starts):
        # the batch ends with the first list that brings it to batch_size rows
        before = ends[first - 1] if first else 0
        last = min(int(np.searchsorted(ends, before + batch_size, side="left")), len(starts) - 1)
        b_starts, b_sizes = starts[first : last + 1], sizes[first : last + 1]
        offsets = np.repeat(b_starts - np.r_[0, np.cumsum(b_sizes)[:-1]], b_sizes)
        idx = rows[np.arange(int(b_sizes.sum())) + offsets]
        yield idx, np.repeat(np.arange(len(b_sizes), dtype=np.int32), b_sizes)
        first = last + 1


class Trainer:
    def __init__(self, spec: FeatureSpec, cfg: TrainConfig):
        cfg.validate(spec)
        self.spec, self.cfg = spec, cfg
        tf.keras.utils.set_random_seed(cfg.seed)
        self.model: DeepFM = build_deepfm(spec)
        self.opt = None
        self._step = None

    def _signature(self, x: dict[str, np.ndarray]):
        return {k: tf.TensorSpec([None] + list(v.shape[1:]), tf.as_dtype(v.dtype)) for k, v in x.items()}

    def prepare(self, x: dict[str, np.ndarray], total_steps: int):
        """A fresh optimizer (``cfg.optimizer``, its learning rate on ``cfg.schedule`` over ``total_steps``) and the
        compiled training step for inputs shaped like ``x``, which it returns: ``step(x, labels, segments)`` ->
        the batch's loss (``bench/train_step.py`` times it)."""
        cfg = self.cfg
        self.opt = OPTIMIZER_FACTORIES[cfg.optimizer](SCHEDULE_FACTORIES[cfg.schedule](cfg.lr, total_steps))
        self._build_fns(x)
        return self._step

    def _build_fns(self, x: dict[str, np.ndarray]):
        sig = self._signature(x)
        model, opt, spec, loss_fn = self.model, self.opt, self.spec, make_loss_fn(self.cfg.loss)
        l2_emb = spec.model.l2_embedding

        @tf.function(input_signature=[sig, tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32)])
        def step(xb, yb, seg):
            with tf.GradientTape() as tape:
                total, obj = training_objective(model, loss_fn, l2_emb, xb, yb, seg)
            grads = tape.gradient(obj, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return total

        self._step = step

    def predict(self, data: Encoded) -> np.ndarray:
        """The model's sigmoid on ``data``; trained on sampled negatives, corrected for the rate
        (``offgraph.calibration``, as the server corrects it from the run's spec): a CTR either way."""
        p = predict_proba(self.model, data.x, self.cfg.eval_batch_size)
        if self.cfg.negative_rate == 1.0:
            return p
        return calibrate(p, Calibration(negative_rate=self.cfg.negative_rate))

    def evaluate(self, data: Encoded) -> dict:
        """The metrics of ``EVAL_METRICS`` and the selection metric by name (those needing request groups where
        the rows have them), the rows and the positive rate (of the binarised labels)."""
        p = self.predict(data)
        names = dict.fromkeys((*EVAL_METRICS, selection_metric(self.cfg)))
        res = {name: make_metric_fn(name)(data.labels, p) for name in names if not needs_groups(name)}
        res.update(rows=int(data.n), positive_rate=float(binarise(data.labels).mean()))
        if data.groups is not None:
            grouped = [name for name in names if needs_groups(name)]
            res.update({name: make_metric_fn(name)(data.labels, p, data.groups) for name in grouped})
        return res

    def fit(self, train: Encoded, validation: Encoded | None, progress: bool = True, label: str = "epoch") -> dict:
        """Epochs over ``train``; after each, the metrics on ``validation`` (rows carved from the training rows,
        never the held-out ones): the best epoch by the selection metric (``cfg.select``, else
        ``default_select``; ``EpochSelection``) has its weights kept and restored, and training stops after
        ``cfg.patience`` epochs without a better one. No validation: every epoch runs, the last is kept."""
        cfg = self.cfg
        if uses_pairs(cfg.loss):  # before the first step, not at the batch that would not fit
            check_pair_rows(train, cfg)
        selection = EpochSelection(selection_metric(cfg), cfg.patience)
        self.prepare(train.x, cfg.epochs * int(np.ceil(train.n / cfg.batch_size)))
        rng = np.random.default_rng(cfg.seed)
        listwise = is_listwise(cfg.loss)
        sig = (self._signature(train.x), tf.TensorSpec([None], tf.float32), tf.TensorSpec([None], tf.int32))
        history = []
        best_weights, stopped = None, None
        t0 = time.perf_counter()
        for epoch in range(1, cfg.epochs + 1):
            t_epoch = time.perf_counter()
            ds = tf.data.Dataset.from_generator(
                lambda: _batches(train, cfg, rng, listwise), output_signature=sig
            ).prefetch(4)
            steps = int(np.ceil(train.n / cfg.batch_size))
            # leave=False: the bar goes when the epoch ends, so each epoch stays on screen as one line (the print)
            bar = tqdm(
                ds, total=steps, desc=f"{label} {epoch}/{cfg.epochs}", disable=not progress, unit="step", leave=False
            )
            losses = []
            for xb, yb, seg in bar:
                losses.append(float(self._step(xb, yb, seg)))
                if len(losses) % 20 == 0:
                    bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
            ev = {"epoch": epoch, "train_loss": float(np.mean(losses))}
            if validation is not None:
                ev["validation"] = self.evaluate(validation)
            ev["seconds"] = time.perf_counter() - t_epoch  # this epoch's own, its validation pass included
            history.append(ev)
            v = ev.get("validation")
            print(
                f"{label} {epoch}: train loss {ev['train_loss']:.4f}"
                + (f"  validation {_metrics_text(v)}" if v else "")
                + f"  ({ev['seconds']:.1f}s)",
                flush=True,
            )
            if v is None:
                continue
            best, stop = selection.update(epoch, v)
            if best:
                best_weights = [w.copy() for w in self.model.get_weights()]
            elif stop:
                stopped = epoch
                break
        best_epoch = selection.best_epoch
        restored = best_weights is not None and best_epoch != history[-1]["epoch"]
        if restored:
            self.model.set_weights(best_weights)
        early = None
        if validation is not None:
            best_auc = history[best_epoch - 1]["validation"]["auc"]
            early = {
                "select": selection.metric,
                "best_epoch": best_epoch,
                "best_validation": _finite_or_none(selection.best_value),  # of the selection metric
                "best_validation_auc": _finite_or_none(best_auc),  # the chosen epoch's, whichever metric chose it
                "epochs_run": len(history),
                "stopped_early_at": stopped,
                "restored_best_weights": restored,
                "patience": cfg.patience,
                "validation_rows": int(validation.n),
            }
            # worded without "epoch N": each epoch is one line of the output
            print(
                f"best validation {selection.metric} {selection.best_value:.4f}"
                + f" after {best_epoch} of {len(history)} epochs"
                + ("; those weights restored" if restored else ""),
                flush=True,
            )
        return {"history": history, "train_seconds": time.perf_counter() - t0, "early_stopping": early}


def _finite_or_none(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def _metrics_text(res: dict) -> str:
    """``name value`` of each metric of an ``evaluate`` result, as recorded."""
    return "  ".join(f"{k} {v:.4f}" for k, v in res.items() if k not in ("rows", "positive_rate"))


def split_encoded(spec: FeatureSpec, data: Encoded, cfg: TrainConfig) -> tuple[Encoded, Encoded]:
    test = held_out_mask(cfg.split, data.n, cfg.held_out, cfg.seed, time=data.time, key=data.key)
    return data.take(np.flatnonzero(~test)), data.take(np.flatnonzero(test))


def carve_validation(train: Encoded, cfg: TrainConfig) -> tuple[Encoded, Encoded | None]:
    """(rows to fit, validation rows): ``cfg.validation`` of the training rows by the same split (per-key-time:
    each key's latest training rows), so the epoch is picked on rows like the held-out ones but not them."""
    if cfg.validation == 0:
        return train, None
    val = held_out_mask(cfg.split, train.n, cfg.validation, cfg.seed + 1, time=train.time, key=train.key)
    return train.take(np.flatnonzero(~val)), train.take(np.flatnonzero(val))


def train_run(
    spec: FeatureSpec,
    table,
    cfg: TrainConfig,
    out_dir: str | Path | None,
    source: str = "<table>",
    progress: bool = True,
) -> tuple[DeepFM, dict]:
    """Encode, split, train, evaluate; write RUN (weights, spec, config, metrics) when out_dir is given."""
    t0 = time.perf_counter()
    cfg, split_why = cfg.for_spec(spec)
    cfg = cfg.replace(select=selection_metric(cfg))  # the run records the metric that chose its epoch
    data = encode_table(spec, table, source)
    train, held = split_encoded(spec, data, cfg)
    fit_rows, validation = carve_validation(train, cfg)
    if needs_stats(spec):  # standardize statistics of the training rows only, then the same maths for all
        spec = fit_numeric_stats(spec, train)
        for part in (train, fit_rows, validation, held):
            if part is not None:
                finish_dense(spec, part)
    fg_seconds = time.perf_counter() - t0
    print(
        f"data {source}: {data.n} rows -> {fit_rows.n} train / "
        + (f"{validation.n} validation / " if validation is not None else "")
        + f"{held.n} held-out ({cfg.split} split: {split_why}); FG {fg_seconds:.1f}s",
        flush=True,
    )
    if cfg.negative_rate != 1.0:  # the served correction, from the run (validate refused a spec stating another)
        spec = spec.with_calibration(negative_rate=cfg.negative_rate)
    trainer = Trainer(spec, cfg)
    fit = trainer.fit(fit_rows, validation, progress)
    early = fit["early_stopping"]
    if early is not None and cfg.refit:
        # the epoch count is chosen; the rows carved off for choosing it are the latest of each key, the most
        # like the held-out ones: retrain from the same start on all the training rows for that many epochs
        early["held_out_auc_before_refit"] = trainer.evaluate(held)["auc"]  # reported, never used to choose
        print(f"refit on all {train.n} training rows for {early['best_epoch']} epochs", flush=True)
        trainer = Trainer(spec, cfg.replace(epochs=early["best_epoch"]))
        refit = trainer.fit(train, None, progress, label="refit")
        early.update(refit_epochs=early["best_epoch"], refit_rows=int(train.n), refit_seconds=refit["train_seconds"])
        fit["train_seconds"] += refit["train_seconds"]
        fit_rows = train
    final = trainer.evaluate(held)  # once, with the weights kept
    print(
        f"held-out AUC {final['auc']:.4f}  {_metrics_text({k: v for k, v in final.items() if k != 'auc'})}", flush=True
    )
    spec, calibration = fit_calibration(
        spec, cfg, trainer, validation, held, trained_on_validation=early is not None and cfg.refit
    )
    metrics = {
        # the export copies held_out into the manifest's training record: with it, the metric that chose the
        # epoch and its best validation value (None without validation rows: the last epoch was kept)
        "held_out": {**final, "selected_by": selected_by(cfg, early)},
        "history": fit["history"],
        "early_stopping": fit["early_stopping"],
        "train_rows": int(fit_rows.n),
        "validation_rows": int(validation.n) if validation is not None else 0,
        "held_out_rows": int(held.n),
        # what a served score is (offgraph.calibration.score_kind): a listwise model's only with its fitted calibration
        "score_kind": score_kind(cfg.loss, spec.model.calibration),
        **({"calibration": calibration} if calibration is not None else {}),
        "train_seconds": fit["train_seconds"],
        "fg_seconds": fg_seconds,
        **spec_record(spec),
        "config": cfg.model_dump(),
        "source": source,
        # the training file, absolute: `offgraph check` checks the held-out rows of this file only
        "data_file": str(Path(source).resolve()) if Path(source).is_file() else None,
    }
    if out_dir is not None:
        write_run(out_dir, trainer.model, spec, cfg, metrics)
    return trainer.model, metrics


def selected_by(cfg: TrainConfig, early: dict | None) -> dict:
    """{metric, best_validation, best_epoch}: what chose the run's epoch count (``cfg.select`` resolved)."""
    return {
        "metric": selection_metric(cfg),
        "best_validation": early["best_validation"] if early else None,
        "best_epoch": early["best_epoch"] if early else None,
    }


def fit_calibration(
    spec: FeatureSpec,
    cfg: TrainConfig,
    trainer: Trainer,
    validation: Encoded | None,
    held: Encoded,
    trained_on_validation: bool,
) -> tuple[FeatureSpec, dict | None]:
    """A listwise model's Platt scaling (``offgraph.model.platt``), fitted on the validation rows with the weights
    kept: (the spec with ``model.calibration.logit_scale`` / ``logit_shift`` set, the run's record of the fit:
    a, b, and the mean score and logloss before and after it on the validation and held-out rows; the held-out
    figures are reported, never used). A pointwise model: (spec, None), its sigmoid is the CTR. No validation
    rows (``--validation 0``) or nothing to fit: the spec unchanged, its scores are ranking scores."""
    if cfg.loss == LossKey.POINTWISE:
        return spec, None
    # a CTR is the probability of a relevant label (relevance.binarise), whatever the grades
    fit = fit_platt(trainer.predict(validation), binarise(validation.labels)) if validation is not None else None
    if fit is None:
        why = (
            "no validation rows (--validation 0)"
            if validation is None
            else "the validation rows hold one class, or the scores rank them backwards"
        )
        print(f"loss {cfg.loss}: no calibration fitted ({why}): the scores are ranking scores, not CTRs", flush=True)
        return spec, {"method": None, "reason": why}
    rec: dict = {
        "method": "platt",
        "logit_scale": fit.logit_scale,
        "logit_shift": fit.logit_shift,
        "fitted_on": "validation",
        "rows": int(validation.n),
        "iterations": fit.iterations,
        # with the refit, the kept weights were trained on the validation rows too
        "trained_on_fit_rows": bool(trained_on_validation),
    }
    for name, part in (("validation", validation), ("held_out", held)):
        p = trainer.predict(part)
        q = platt(p, fit.logit_scale, fit.logit_shift)
        rec[name] = {
            "rows": int(part.n),
            "positive_rate": float(binarise(part.labels).mean()) if part.n else None,
            "mean_score": float(p.mean()) if part.n else None,
            "mean_score_calibrated": float(q.mean()) if part.n else None,
            "logloss": logloss(part.labels, p),
            "logloss_calibrated": logloss(part.labels, q),
        }
    h = rec["held_out"]
    print(
        f"calibration (Platt, {validation.n} validation rows): logit' = {fit.logit_scale:.4f} logit "
        f"{fit.logit_shift:+.4f}; held-out mean score {h['mean_score']:.4f} -> {h['mean_score_calibrated']:.4f} "
        f"(positive rate {h['positive_rate']:.4f}), logloss {h['logloss']:.4f} -> {h['logloss_calibrated']:.4f}",
        flush=True,
    )
    return spec.with_calibration(logit_scale=fit.logit_scale, logit_shift=fit.logit_shift), rec


def spec_record(spec: FeatureSpec) -> dict:
    """What a run records that its spec implies, and the exporter checks: the FG version, the segmenter (and
    library version) of each tokenize field, the fitted numeric stats and each field's table rows."""
    return {
        "fg_version": spec.fg_version,
        "segmenters": segmenters_of(spec),
        "numeric_stats": {f.name: f.params["stats"] for f in spec.numeric if "stats" in f.params},
        "table_rows": {f.name: f.rows for f in spec.fields},
    }


def write_run(out_dir: str | Path, model: DeepFM, spec: FeatureSpec, cfg: TrainConfig, metrics: dict) -> Path:
    """Write a run directory (weights, spec.yaml, train_config.json, metrics.json, and training_curves.png when
    it trained epochs), replacing ``out_dir``.
    metrics.json holds ``metrics`` with what the spec implies (``spec_record``) recorded from ``spec`` itself,
    so a run built by hand (a model and ``metrics={}``) exports like a trained one."""
    metrics = {**metrics, **spec_record(spec)}
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_weights(tmp / WEIGHTS_FILE)
    (tmp / SPEC_FILE).write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    (tmp / CONFIG_FILE).write_text(json.dumps(cfg.model_dump(), indent=2))
    (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2, default=float))
    write_curves(metrics.get("history", []), tmp / CURVES_FILE, title=out.name)
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
