"""Open one model version as a scorer and warm it up before it may serve."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from exporter.scorer import Scorer
from server.config import ServerConfig
from server.served import ServedVersion

log = logging.getLogger("offgraph.server")

# candidate counts of the warm-up requests: the first call of a size pays one-off costs
WARMUP_SIZES = (1, 16)


def warm_up(scorer, n: int) -> None:
    """Score requests built from the spec's raw inputs (no values: zero embeddings) at a few sizes.

    Raises ValueError if the scores are not finite CTRs in [0, 1].
    """
    request = {c: None for c in scorer.spec.raw_inputs("request")}
    item = {c: None for c in scorer.spec.raw_inputs("item")}
    for size in sorted({*WARMUP_SIZES, n}):
        scores = np.asarray(scorer.score(request, [dict(item) for _ in range(size)]))
        if scores.shape != (size,):
            raise ValueError(f"warm-up: {size} candidates gave scores of shape {scores.shape}")
        if not np.all(np.isfinite(scores)) or scores.min() < 0 or scores.max() > 1:
            raise ValueError(f"warm-up: scores are not finite CTRs in [0, 1] (min {scores.min()}, "
                             f"max {scores.max()})")


def open_version(version_dir: Path, config: ServerConfig, row_cache_mb: float) -> ServedVersion:
    """Load, warm up and return one version; raises whatever made it unservable."""
    t0 = time.perf_counter()
    scorer = Scorer(version_dir, store_mode="follow", row_cache_mb=row_cache_mb,
                    follow_interval_s=config.follow_interval_s, catch_up_s=config.catch_up_s,
                    item_cache_size=config.item_cache_size, max_request_values=config.max_request_values,
                    verify=config.verify)
    try:
        warm_up(scorer, config.warmup_candidates)
    except BaseException:
        scorer.close()
        raise
    return ServedVersion(scorer, time.perf_counter() - t0, row_cache_mb)
