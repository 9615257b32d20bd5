"""The dense SavedModel's ``split`` signature (the request's part of the head computed once) on exported
versions of the tiny MovieLens model and of the numeric one: recorded in the manifest, the same scores as
``serving_default`` on real requests, and a version without the record still serves with the old signature."""

from __future__ import annotations

import numpy as np
import pytest
from scorer_parts import DenseHead, grouped_requests, pooled
from server_helpers import copy_version

from offgraph.calibration import calibrate
from offgraph.export.export import export_run
from offgraph.modeldir.manifest import ModelDirError
from offgraph.scoring.scorer import Scorer

PARITY = 1e-6  # max |dp| of the split head against the unsplit one, fp32


@pytest.fixture(scope="module")
def tiny_version(tiny_model):
    return tiny_model[0] / "ml" / "1"


@pytest.fixture(scope="module")
def numeric_version(numeric_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("split_numeric") / "num" / "1"
    export_run(numeric_run[0], out, shards=2, quant="fp32", progress=False)
    return out


def _max_dp(scorer: Scorer, requests) -> float:
    worst = 0.0
    head = DenseHead(scorer.version_dir)
    for request, cands in requests:
        emb, fo, dense = pooled(scorer, request, cands)
        split = head(emb, fo, dense, split=True)
        whole = head(emb, fo, dense)
        assert split.shape == whole.shape == (len(cands),)
        worst = max(worst, float(np.abs(split - whole).max()))
    return worst


def test_the_manifest_records_the_split_by_the_fields_scopes(tiny_version, numeric_version):
    for vdir, num_dense in ((tiny_version, 0), (numeric_version, 1)):
        with Scorer(vdir) as s:
            split = s.manifest.dense.split
            assert split is not None and split.name == "split"
            fields = s.spec.fields
            assert list(split.request_fields) == [i for i, f in enumerate(fields) if f.scope == "request"]
            assert list(split.candidate_fields) == [i for i, f in enumerate(fields) if f.scope != "request"]
            assert {fields[i].scope for i in split.candidate_fields} == {"item", "cross"}  # crosses read an item
            want = ["req_emb", "req_first_order", "cand_emb", "cand_first_order"] + ["dense"] * num_dense
            assert list(split.inputs) == want
            assert split.inputs["req_emb"]["shape"] == [1, len(split.request_fields), s.dim]


def test_split_head_scores_as_the_unsplit_one_on_real_requests(tiny_version, requests_):
    with Scorer(tiny_version) as s:
        assert s._split is not None
        worst = _max_dp(s, requests_)
    print(f"tiny model: max |dp| split vs unsplit over {len(requests_)} requests: {worst:.3g}")
    assert worst <= PARITY


def test_split_head_with_a_numeric_field_scores_as_the_unsplit_one(numeric_version, numeric_run):
    with Scorer(numeric_version) as s:
        assert s.num_dense == 1 and s._split is not None
        reqs = grouped_requests(s.spec, numeric_run[1].slice(20000), 40)
        worst = _max_dp(s, reqs)
    print(f"numeric model: max |dp| split vs unsplit over {len(reqs)} requests: {worst:.3g}")
    assert worst <= PARITY


def test_a_version_without_the_split_record_serves_with_the_old_signature(tiny_version, requests_, tmp_path):
    """An older version's manifest has no ``dense.split``: it is scored through ``serving_default``; a version
    with it is scored through the split signature (its request fields pooled once), within the parity bound."""
    old = tmp_path / "ml" / "1"
    copy_version(tiny_version, old, manifest_edit=lambda m: m["dense"].pop("split"))
    head_old, head_now = DenseHead(old), DenseHead(tiny_version)
    # the SavedModel's signatures alone (numpy_head_max_rows=0): which one scores is what this test checks, bit for bit
    with Scorer(old, numpy_head_max_rows=0) as before, Scorer(tiny_version, numpy_head_max_rows=0) as now:
        assert before.manifest.dense.split is None and before._split is None
        for request, cands in requests_[:20]:
            emb, fo, _ = pooled(before, request, cands)
            p_old = before.score(request, cands)
            np.testing.assert_array_equal(head_old(emb, fo), head_now(emb, fo))  # the unsplit signature
            assert float(np.abs(head_now(emb, fo, split=True) - head_old(emb, fo)).max()) <= PARITY
            np.testing.assert_array_equal(p_old, calibrate(head_old(emb, fo), before.calibration))
            p_now = now.score(request, cands)
            np.testing.assert_array_equal(p_now, calibrate(head_now(emb, fo, split=True), now.calibration))
            assert float(np.abs(p_now - p_old).max()) <= PARITY


def test_a_split_record_that_does_not_divide_the_fields_is_refused(tiny_version, tmp_path):
    def drop_one(m):
        m["dense"]["split"]["candidate_fields"] = m["dense"]["split"]["candidate_fields"][1:]

    def unknown_signature(m):
        m["dense"]["split"]["name"] = "no_such_signature"

    for i, edit in enumerate((drop_one, unknown_signature)):
        copy_version(tiny_version, tmp_path / "ml" / str(i + 1), manifest_edit=edit)
        with pytest.raises(ModelDirError, match="divide|no signature"):
            Scorer(tmp_path / "ml" / str(i + 1))
