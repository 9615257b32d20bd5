"""``offgraph.scoring.scorer.Scorer`` through its public API on the tiny real exported model (conftest's
``tiny_model``): full-feature and ids-only candidates score as the trained Keras model predicts the same rows,
empty candidates, unknown ids, and the scorer's refusals.

The expected scores come from the run itself (``load_run`` + ``predict_proba`` on the encoded table rows, then the
spec's calibration), not from the serving path."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from server_helpers import copy_models, copy_version

from offgraph.calibration import calibrate
from offgraph.feature_tables.build import build_feature_tables
from offgraph.feature_tables.join import IdsOnlyError
from offgraph.features.fg import FeatureValueError
from offgraph.model.inputs import encode_table
from offgraph.model.model import load_run, predict_proba
from offgraph.modeldir.manifest import ModelDirError
from offgraph.scoring.scorer import Scorer, load

TOL = 1e-5  # |dp| of an fp32 export against Keras (``offgraph check``'s float slack)
REQUEST_INPUTS = ["user_id", "age", "gender", "occupation", "zip_prefix"]
ITEM_INPUTS = ["movie_id", "genres", "title_words", "release_year"]


@pytest.fixture(scope="module")
def models(tiny_model, tmp_path_factory):
    """A copy of the tiny model's MODELS dir, with its user and item feature tables loaded from its table."""
    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path_factory.mktemp("scorer") / "models")
    with Scorer(models / "ml" / "1", verify=False) as s:
        spec = s.spec
    build_feature_tables(models / "ml", spec, table, progress=False)
    return models


@pytest.fixture(scope="module")
def keras_requests(tiny_model):
    """Real requests of the table (rows grouped by request_id) with the Keras model's calibrated predictions of
    the same rows: [(request, candidates, expected scores)]."""
    pristine, table = tiny_model
    model, spec, _ = load_run(pristine.parent / "run")
    cols = table.to_pydict()
    groups: dict[str, list[int]] = {}
    for i, rid in enumerate(cols["request_id"]):
        groups.setdefault(rid, []).append(i)
    picked = [rows for rows in groups.values() if len(rows) >= 2][:25]
    idx = np.concatenate([np.asarray(rows) for rows in picked])
    sub = encode_table(spec, table.take(idx))
    p = calibrate(predict_proba(model, sub.x), spec.model.calibration)
    out, at = [], 0
    for rows in picked:
        request = {c: cols[c][rows[0]] for c in REQUEST_INPUTS}
        assert all({c: cols[c][i] for c in REQUEST_INPUTS} == request for i in rows)  # one request's rows
        out.append((request, [{c: cols[c][i] for c in ITEM_INPUTS} for i in rows], p[at : at + len(rows)]))
        at += len(rows)
    return out


def _ids_only(request, cands):
    return {"user_id": request["user_id"]}, [{"movie_id": c["movie_id"]} for c in cands]


def test_full_feature_candidates_score_as_keras_predicts(models, keras_requests):
    with load(models / "ml") as s:
        assert s.version == 1 and s.score_kind == "ctr"
        for request, cands, want in keras_requests:
            got = s.score(request, cands)
            assert got.dtype == np.float32 and got.shape == (len(cands),)
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_ids_only_candidates_score_as_their_full_features(models, keras_requests):
    """The tables hold every row's values (the tiny table has one value per key): ids-only is the same request."""
    with Scorer(models / "ml" / "1") as s:
        for request, cands, want in keras_requests:
            got, joined = s.score_joined(*_ids_only(request, cands))
            assert joined.unknown_candidates == 0 and not joined.unknown_request
            np.testing.assert_array_equal(got, s.score(request, cands))
            np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


def test_empty_candidates_give_no_scores(models, keras_requests):
    request = keras_requests[0][0]
    with Scorer(models / "ml" / "1") as s:
        for r in (request, _ids_only(request, [])[0]):
            got = s.score(r, [])
            assert got.dtype == np.float32 and got.shape == (0,)


def test_unknown_ids_score_as_keras_predicts_them(models, keras_requests, tiny_model):
    """An id no row was trained on still hashes to a row: the scorer gives what the Keras model gives for it."""
    pristine, table = tiny_model
    model, spec, _ = load_run(pristine.parent / "run")
    request, cands, _ = keras_requests[0]
    request = {**request, "user_id": 987654321}
    cands = [{**cands[0], "movie_id": 123456789}, *cands[1:]]
    rows = [{**request, **c} for c in cands]
    one = table.slice(0, 1).to_pylist()[0]
    unseen = pa.Table.from_pylist([{**one, **r} for r in rows], schema=table.schema)
    want = calibrate(predict_proba(model, encode_table(spec, unseen).x), spec.model.calibration)
    with Scorer(models / "ml" / "1") as s:
        np.testing.assert_allclose(s.score(request, cands), want, rtol=0, atol=TOL)
        # ids-only with keys the tables lack: counted as unknown, scored as the keys with no other values
        got, joined = s.score_joined(*_ids_only(request, cands))
        assert joined.unknown_candidates == 1 and joined.unknown_request
        before = s.stats()["unknown_candidates"]
        s.score(*_ids_only(request, cands))
        assert s.stats()["unknown_candidates"] == before + 1


def test_refusals(models, keras_requests, tmp_path):
    request, cands, _ = keras_requests[0]
    vdir = models / "ml" / "1"
    with pytest.raises(ValueError, match="row_cache_mb"):
        Scorer(vdir, row_cache_mb=-1)
    with pytest.raises(ValueError, match="follow_interval_s"):
        Scorer(vdir, follow_interval_s=0)
    with pytest.raises(ModelDirError, match="no complete version"):
        load(tmp_path)
    with Scorer(vdir, max_request_values=3) as s:  # a bound on one call's feature values
        with pytest.raises(FeatureValueError, match="more than 3 feature values"):
            s.score(request, cands)
    # a model without feature tables: ids-only requests are refused, naming the key
    copy_version(vdir, tmp_path / "plain" / "1", manifest_edit=_drop_tables)
    with Scorer(tmp_path / "plain" / "1") as s, Scorer(vdir) as with_tables:
        assert s.join is None
        with pytest.raises(IdsOnlyError, match="movie_id|user_id"):
            s.score(*_ids_only(request, cands))
        np.testing.assert_array_equal(s.score(request, cands), with_tables.score(request, cands))


def _drop_tables(m):
    m["spec"].pop("tables")
    m.pop("feature_tables")
