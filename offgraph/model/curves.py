"""Pictures of a training run: its per-epoch curves, written beside metrics.json as ``training_curves.png``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

CURVES_FILE = "training_curves.png"


def write_curves(history: Sequence[dict[str, Any]], path: str | Path, title: str = "") -> Path | None:
    """Train loss, and validation AUC and logloss where the run had a validation split, per epoch (``history``:
    metrics.json's). Returns the file written, or None for a history without epochs."""
    if not history:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    epochs = [h["epoch"] for h in history]
    val = [h.get("validation") for h in history]
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(9, 3.4))
    ax_loss.plot(epochs, [h["train_loss"] for h in history], "o-", label="train loss")
    if all(v is not None for v in val):
        ax_loss.plot(epochs, [v["logloss"] for v in val], "s--", label="validation logloss")
        ax_auc.plot(epochs, [v["auc"] for v in val], "o-", color="tab:green")
    else:
        ax_auc.text(0.5, 0.5, "no validation split", ha="center", va="center", transform=ax_auc.transAxes)
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss")
    ax_loss.legend(fontsize=8)
    ax_auc.set_xlabel("epoch")
    ax_auc.set_ylabel("validation AUC")
    for ax in (ax_loss, ax_auc):
        ax.set_xticks(epochs)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
