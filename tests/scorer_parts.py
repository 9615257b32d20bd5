"""The scorer's request path taken apart from its public pieces, for tests that change a pooled input by hand
and score it: FG (``Scorer.features``), the unique keys and pooling (``offgraph.scoring.batch``), a store read
(``Scorer.store``) and the version's dense SavedModel called through its signatures (``ModelVersion.dense``).
No row cache, no write feed: the pooled inputs are the store's rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

from offgraph.modeldir.layout import SIGNATURE
from offgraph.modeldir.version import ModelVersion
from offgraph.scoring.batch import batch_keys, pool_batch
from offgraph.scoring.scorer import Scorer


def pooled(scorer: Scorer, request, candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(emb [N, F, D], first_order [N, F], dense [N, k])`` of one request's candidates as stored now."""
    batch = scorer.features(request, candidates)
    keys = batch_keys(batch)
    vectors, weights, _ = scorer.store.read_unique(keys.unique_tables, keys.unique_rows)
    poolings = [f.pooling for f in scorer.spec.fields]
    emb, first_order = pool_batch(batch, keys, vectors, weights, poolings, scorer.dim)
    return emb, first_order, batch.dense


class DenseHead:
    """A version's dense head: CTRs [N] before calibration of pooled inputs (:func:`pooled`)."""

    def __init__(self, version_dir: str | Path):
        mv = ModelVersion.open(version_dir)
        self._loaded, _ = mv.dense  # keep the loaded object alive while its signatures are used
        self._split = mv.manifest.dense.split if mv.manifest.dense is not None else None
        self.num_dense = len(mv.spec.numeric)

    def __call__(
        self, emb: np.ndarray, first_order: np.ndarray, dense: np.ndarray | None = None, split: bool = False
    ) -> np.ndarray:
        """With ``split`` and a version that records the split signature: the request fields from row 0, their
        part of the head once; else every candidate's fields through ``serving_default``."""
        if split and self._split is not None:
            req, cand = list(self._split.request_fields), list(self._split.candidate_fields)
            fn = self._loaded.signatures[self._split.name]
            inputs = {
                "req_emb": emb[:1, req],
                "req_first_order": first_order[:1, req],
                "cand_emb": emb[:, cand],
                "cand_first_order": first_order[:, cand],
            }
        else:
            fn = self._loaded.signatures[SIGNATURE]
            inputs = {"emb": emb, "first_order": first_order}
        if self.num_dense:
            inputs["dense"] = dense
        specs = fn.structured_input_signature[1]
        return fn(**{k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()})["ctr"].numpy()


def grouped_requests(spec, table, limit: int) -> list[tuple[dict, list[dict]]]:
    """Real requests of ``table`` (at most ``limit``, each of 3 to 100 candidates): rows grouped by the spec's group
    column, the request's and items' raw inputs."""
    cols = table.to_pydict()
    req_in, item_in = spec.raw_inputs("request"), spec.raw_inputs("item")
    groups: dict = {}
    for i, g in enumerate(cols[spec.group]):
        groups.setdefault(g, []).append(i)
    out = []
    for rows in groups.values():
        if len(rows) >= 3:
            out.append(({c: cols[c][rows[0]] for c in req_in}, [{c: cols[c][i] for c in item_in} for i in rows[:100]]))
        if len(out) == limit:
            break
    return out
