"""Settings of the incremental trainer (`StreamTrainConfig`) and the names they may take. Imports
nothing heavy (pydantic): `offgraph stream-train` takes its defaults from here without loading
TensorFlow (`offgraph.streaming.stream_train` does)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from offgraph.config import ConfigModel, option

OPTIMIZERS = ("sgd", "adagrad")
# milliseconds per unit of the spec's time column; "auto" guesses it (_stream_train.to_millis)
TIME_UNITS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (``user_id,movie_id``), blanks dropped."""
    return tuple(f.strip() for f in text.split(",") if f.strip())


class StreamTrainConfig(ConfigModel, validate_assignment=True):
    """lr: embedding step size. The loss is SUMMED over a batch, so keep lr x batch_size small.
    optimizer: sgd, or adagrad (row-wise, accumulator starting at adagrad_init).
    l2: l2/2 * |row|^2 on the rows a batch touches.
    every_events / every_seconds: emit one delta file after this many events or seconds (both
        None: one file at the end).
    seq_start: first sequence number (None: time.time_ns() at start).
    time_unit: unit of the spec's time column: auto, s, ms, us or ns.
    lr_first_order: learning rate of the first-order weights (None: lr).
    fields: fields whose rows are trained (None: all); the others stay frozen.
    train_bias: whether the model's bias moves (the stream's bias row, offgraph.store.keys.BIAS_TABLE).
    append_ids: whether ids new to a vocabulary field with a capacity get rows of their own (appended).
    lr_bias: the bias's learning rate (None: lr). Every event of a batch pushes the bias, so its summed step is
        a batch's worth of a row's: with the first-order weights' larger rate (0.1 on the demo) it swung, the demo's
        progressive logloss 0.648 against 0.601 with lr (0.003) and 0.600 with the bias kept.
    """

    lr: float = option(
        0.003,
        gt=0,
        flag="--lr",
        description="embedding step size (the loss is summed over a batch: keep lr x batch small)",
    )
    optimizer: Literal[OPTIMIZERS] = option("sgd", flag="--optimizer", description="adagrad is row-wise")
    batch_size: int = option(32, ge=1, flag="--batch-size", description="events per step")
    l2: float = option(0.0, ge=0, flag="--l2", description="L2 on the touched rows (l2/2 |row|^2 per batch)")
    adagrad_init: float = option(0.1, ge=0, flag="--adagrad-init", description="initial row-wise Adagrad accumulator")
    adagrad_eps: float = Field(1e-8, ge=0)
    every_events: int | None = option(
        None, ge=1, flag="--every-events", shown="at the end only", description="emit one delta file every K events"
    )
    every_seconds: float | None = option(
        None,
        gt=0,
        flag="--every-seconds",
        shown="at the end only",
        description="... or every T seconds (and at the end)",
    )
    seq_start: int | None = option(
        None, ge=0, flag="--seq-start", shown="time_ns now", description="first sequence number"
    )
    time_unit: Literal[("auto", *TIME_UNITS)] = option(
        "auto", flag="--time-unit", description="unit of the spec's time column"
    )
    lr_first_order: float | None = option(
        None, ge=0, flag="--lr-first-order", shown="--lr", description="learning rate of the first-order weights"
    )
    lr_bias: float | None = option(
        None,
        ge=0,
        flag="--lr-bias",
        shown="--lr",
        description="learning rate of the model's bias (every event of a batch pushes it: keep it small)",
    )
    train_bias: bool = option(
        True,
        flag="--train-bias",
        description="move the model's bias too (a row of its store that every score adds: offgraph.store.keys)",
    )
    append_ids: bool = option(
        True,
        flag="--append-ids",
        description="give an id a vocabulary field (with a capacity) lacks the field's next free row, appended to "
        "the served vocabulary with the row (offgraph.store.vocabulary_appends); off: it trains the unknown row",
    )
    fields: Annotated[tuple[str, ...], Field(strict=False)] | None = option(  # a list too
        None,
        flag="--fields",
        parse=names,
        shown="all",
        description="comma-separated fields whose rows are trained; e.g. user_id,movie_id: shared side-feature "
        "tables stay frozen",
    )

    @model_validator(mode="after")
    def _adagrad_divides(self) -> StreamTrainConfig:
        if self.optimizer == "adagrad" and self.adagrad_init == 0 and self.adagrad_eps == 0:
            raise ValueError("adagrad needs adagrad_init > 0 or adagrad_eps > 0 (a zero gradient would divide by 0)")
        return self
