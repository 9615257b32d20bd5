"""Training settings (`TrainConfig`) and the names they may take. Imports nothing heavy (pydantic), so
that the command line can offer them, and take its defaults from them, without loading TensorFlow
(`offgraph.model.train` maps the names to Keras objects)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from offgraph.config import ConfigModel, option
from offgraph.modeldir.layout import LOSSES  # one definition: the manifest records it

if TYPE_CHECKING:  # only a type here: importing features would load NumPy into `offgraph --help`
    from offgraph.features.spec import FeatureSpec

OPTIMIZERS = ("adam", "lazy_adam", "adagrad")
"""adam: Keras Adam, every row of every table each step; lazy_adam (the default): the rows a batch looked up only
(``offgraph.model.sparse_optimizer``), a step's cost the batch's, not the tables' (``bench/results/train-step/``)."""
SCHEDULES = ("constant", "cosine")


class TrainConfig(ConfigModel, validate_assignment=True):
    """Settings of one training run (recorded in the run's ``train_config.json``).

    held_out: the held-out fraction, in (0, 1); split: a name of ``offgraph.model.splits.SPLITS``, or None for
    the spec's natural one (``default_split``: per-key-time where the spec names its ``time`` and ``split_key``
    columns, random otherwise), resolved by ``for_spec`` before training (a run records the name).
    validation: the fraction of the TRAINING rows (after the held-out ones are set aside) carved off, by
    the same split, to pick the best epoch on (early stopping with the best weights restored) and, with a
    listwise loss, to fit the calibration on (``offgraph.model.platt``; 0: no validation, the last epoch is
    kept and a listwise model's scores are ranking scores); select: the validation metric that picks the
    epoch (``offgraph.model.metrics``; None: AUC for the pointwise loss, NDCG@10 for one that compares a list's
    candidates, ``offgraph.model.train.default_select``, resolved and recorded by ``train_run``; logloss and
    arp: lower is better); max_list_size: the most rows of one list a batch of a loss that compares a list's
    candidates holds (``offgraph.model.train.list_batches``: a longer list is sampled afresh each epoch);
    negative_rate: the share r of the negative rows (label 0) each epoch trains on, drawn afresh each epoch
    (pointwise only; the run's spec then states ``model.calibration.negative_rate: r``, the serving correction
    p / (p + (1 - p) / r); a spec stating another rate is refused); patience: epochs without a better value of
    it before stopping; refit: then
    retrain from the same initial weights on all the training rows for the best epoch count (the carved rows
    are each key's latest, the most useful to learn from; off: keep the restored weights).
    """

    epochs: int = option(6, ge=1, flag="--epochs", description="passes over the training rows")
    batch_size: int = option(512, ge=1, flag="--batch-size", description="rows per step")
    lr: float = option(0.001, gt=0, flag="--lr", description="learning rate")
    optimizer: Literal[OPTIMIZERS] = option(
        "lazy_adam",
        flag="--optimizer",
        description="optimizer: lazy_adam updates only the table rows a batch looked up (and their Adam moments); "
        "adam (Keras') updates every row each step",
    )
    loss: Literal[LOSSES] = option("pointwise", flag="--loss", description="loss")
    split: str | None = option(
        None,
        flag="--split",
        shown="per-key-time when the spec has 'time' and 'split_key', else random",
        description="held-out split",
    )
    max_list_size: int = option(
        100,
        ge=2,
        flag="--max-list-size",
        description="most rows of one list (the spec's group) a ranking loss's batch holds: a longer list is "
        "sampled afresh each epoch",
    )
    negative_rate: float = option(
        1.0,
        gt=0,
        le=1,
        flag="--negative-rate",
        description="share of the negative training rows (label 0) each epoch trains on, a fresh sample each "
        "epoch (pointwise loss only); the run's spec then states it as model.calibration.negative_rate, so "
        "served scores are corrected back to CTRs; 1: every row",
    )
    held_out: float = option(0.2, gt=0, lt=1, flag="--held-out", description="held-out fraction, in (0, 1)")
    seed: int = option(0, ge=0, flag="--seed", description="seeds the split, the initial weights and the shuffles")
    validation: float = option(
        0.1,
        ge=0,
        lt=1,
        flag="--validation",
        description="fraction of the training rows (same split) that picks the best epoch: early stopping, "
        "best weights restored; 0: keep the last epoch",
    )
    select: str | None = option(
        None,
        flag="--select",
        shown="auc for --loss pointwise, ndcg@10 for the others",
        description="validation metric that picks the best epoch (early stopping) and the refit's epoch count: "
        "auc, logloss, ndcg@K, map, mrr or arp (logloss and arp: lower is better)",
    )
    patience: int = option(
        2, ge=1, flag="--patience", description="epochs without a better validation --select metric before stopping"
    )
    refit: bool = option(
        True,
        flag="--no-refit",
        description="keep the best epoch's weights of the validation pass instead of retraining on all the "
        "training rows for that many epochs",
    )
    eval_batch_size: int = Field(8192, ge=1)
    schedule: Literal[SCHEDULES] = "constant"

    @field_validator("split")
    @classmethod
    def _known_split(cls, v: str | None) -> str | None:
        from offgraph.model.splits import SPLITS  # NumPy: only when a split is given (not for the CLI's --help)

        if v is not None and v not in SPLITS:
            raise ValueError(f"unknown split {v!r}: expected one of {sorted(SPLITS)}")
        return v

    @field_validator("select")
    @classmethod
    def _known_metric(cls, v: str | None) -> str | None:
        from offgraph.model.metrics import make_metric_fn  # NumPy: only when a metric is given

        if v is not None:
            make_metric_fn(v)  # a ValueError naming the known ones
        return v

    def validate(self, spec: FeatureSpec) -> None:
        """What depends on the spec (the fields themselves are checked when set): before any data is read."""
        stated = spec.model.calibration.negative_rate
        if self.negative_rate != 1.0 and self.loss != "pointwise":
            raise ValueError(
                f"--negative-rate {self.negative_rate:g} needs --loss pointwise: a {self.loss!r} model's scores "
                "are calibrated by a Platt fit on unsampled validation rows instead"
            )
        if self.negative_rate != 1.0 and stated != 1.0 and stated != self.negative_rate:
            raise ValueError(
                f"the spec states model.calibration.negative_rate {stated:g}, and this run samples negatives at "
                f"--negative-rate {self.negative_rate:g}: the served correction would not match the training; "
                "leave the rate out of the spec (training writes it into the run's spec) or give the same one"
            )
        if self.loss != "pointwise" and not spec.group:
            raise ValueError(f"loss {self.loss!r} needs request groups: the spec has no 'group' column")
        if self.select is not None and not spec.group:
            from offgraph.model.metrics import needs_groups

            if needs_groups(self.select):
                raise ValueError(f"--select {self.select} needs request groups: the spec has no 'group' column")
        lacking = [k for k in SPLIT_NEEDS.get(self.split or "", ()) if getattr(spec, k) is None]
        if lacking:
            needs = " and ".join(f"'{k}'" for k in SPLIT_NEEDS[str(self.split)])
            raise ValueError(
                f"split {self.split!r} needs the spec's {needs} columns, and the spec has no "
                + " and no ".join(f"'{k}'" for k in lacking)
                + ": pass --split random (split='random'), or name those columns in the spec"
            )

    def for_spec(self, spec: FeatureSpec) -> tuple[TrainConfig, str]:
        """(these settings with the split named, why that split): the split given, or ``default_split``'s."""
        self.validate(spec)
        if self.split is not None:
            return self, "as asked"
        name, why = default_split(spec)
        return self.replace(split=name), why


SPLIT_NEEDS: dict[str, tuple[str, ...]] = {"time": ("time",), "per-key-time": ("time", "split_key")}
"""The spec's columns each split reads (``offgraph.model.splits``)."""


def default_split(spec: FeatureSpec) -> tuple[str, str]:
    """(split, why): per-key-time (each key's latest rows held out, as a model serving tomorrow's requests of
    known users meets them) where the spec names ``time`` and ``split_key``, random otherwise."""
    if spec.time is not None and spec.split_key is not None:
        return "per-key-time", f"the spec has time '{spec.time}' and split_key '{spec.split_key}'"
    lacking = " and no ".join(f"'{k}'" for k in SPLIT_NEEDS["per-key-time"] if getattr(spec, k) is None)
    return "random", f"the spec has no {lacking}, which per-key-time needs"
