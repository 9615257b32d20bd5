"""The JSON of a model's status (``GET /v1/models``, ``GET /v1/models/{name}``, the admin calls' answers),
shaped from what the model registry holds: a ``ModelHolder`` and its served versions (plain state, no JSON).

Its fields are ``offgraph.server.api.schemas.ModelStatus``'s; ``model_version_status`` is TF Serving's
(``offgraph.server.api.version_status``).
"""

from __future__ import annotations

import time
from typing import Any

from offgraph.server.api.version_status import version_status
from offgraph.server.models.served import ModelHolder, memory_status, scorer_stats


def model_status(h: ModelHolder) -> dict[str, Any]:
    """What GET /v1/models/{name} answers, from the holder's own state (no filesystem access: versions on disk
    are as of the registry's last poll)."""
    sv = h.current
    loaded = None
    if sv is not None:
        m = sv.scorer.manifest
        store = m.store
        row_counts = dict(store.row_counts)
        stats = scorer_stats(sv.scorer)
        hits, misses = stats.get("cache_hits"), stats.get("cache_misses")
        if isinstance(hits, (int, float)) and isinstance(misses, (int, float)):
            stats["cache_hit_ratio"] = hits / (hits + misses) if hits + misses else None
        last = stats.get("last_feed_poll_unix")
        stats["freshness_seconds"] = time.time() - last if isinstance(last, (int, float)) and last else None
        training = m.training or None
        loaded = {
            "version": sv.version,
            "loaded_at_unix": sv.loaded_at,
            "load_seconds": sv.load_seconds,
            "in_flight": sv.in_flight,
            "quantization": store.quant,
            "shards": store.shards,
            **_rows_at(store.to_dict()),
            "embedding_dim": m.embedding_dim,
            "row_counts": row_counts,
            "total_rows": sum(row_counts.values()),
            "row_cache_mb": sv.row_cache_mb,
            "memory": memory_status(sv),
            "created_at": m.created_at,
            "training": training,
            "store": stats,
            "training_loss": sv.scorer.training_loss,
            "score_kind": sv.scorer.score_kind,
        }
    spec = sv.scorer.spec if sv is not None else None
    return {
        "name": h.name,
        "state": h.state,
        "policy": h.policy,
        "versions_on_disk": list(h.versions_on_disk),
        "loaded": loaded,
        "loading_version": h.loading_version,
        "previous_version": h.previous_version,
        "refused": [{"version": v, "reason": r.reason, "at_unix": r.at} for v, r in sorted(list(h.refused.items()))],
        "inputs": {s: spec.raw_inputs(s) for s in ("request", "item")} if spec is not None else {},
        "feature_tables": _feature_tables(sv.scorer) if sv is not None else [],
        "labels": dict(h.labels),
        "served_versions": [s.version for s in h.served()],
        "last_error": h.last_error,
        "scans": h.scans,
        "updater": h.updater,
        "model_version_status": version_status(h),
    }


def _rows_at(record: dict) -> dict[str, str | None]:
    """A manifest's store record as the status shows where its rows live."""
    backend = record.get("backend", "rocksdb")
    remote = backend != "rocksdb"
    return {
        "backend": backend,
        "rows_at": f"{record.get('url')} namespace {record.get('namespace')}" if remote else None,
    }


def _feature_tables(scorer) -> list[dict[str, Any]]:
    join = scorer.join
    return [
        {**t.to_dict(), "present": join is not None and join.dbs.get(t.name) is not None} for t in scorer.spec.tables
    ]
