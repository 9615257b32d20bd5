"""Training settings (`TrainConfig`) and the names they may take. Imports nothing heavy, so that the
command line can offer them without loading TensorFlow (`dense_model.train` maps the names to Keras
objects)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only a type here: importing features would load NumPy into `offgraph --help`
    from features.spec import FeatureSpec

LOSSES = ("pointwise", "listwise", "both")
OPTIMIZERS = ("adam", "adagrad")
SCHEDULES = ("constant", "cosine")


@dataclass
class TrainConfig:
    epochs: int = 6
    batch_size: int = 512
    lr: float = 0.001
    optimizer: str = "adam"
    loss: str = "pointwise"
    split: str = "per-key-time"
    held_out: float = 0.2
    seed: int = 0
    eval_batch_size: int = 8192
    schedule: str = "constant"

    def validate(self, spec: FeatureSpec) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}: expected one of {sorted(OPTIMIZERS)}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown lr schedule {self.schedule!r}: expected one of {sorted(SCHEDULES)}")
        if self.loss not in LOSSES:
            raise ValueError(f"unknown loss {self.loss!r}: expected one of {LOSSES}")
        if self.loss != "pointwise" and not spec.group:
            raise ValueError(f"loss {self.loss!r} needs request groups: the spec has no 'group' column")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("epochs and batch size must be >= 1 and lr > 0")
