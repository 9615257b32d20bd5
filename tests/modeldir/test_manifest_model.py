"""The typed manifest (``offgraph.modeldir.manifest_model.Manifest``) and ``ModelVersion.open``: frozen, the
JSON on disk read back unchanged, ill-formed manifests refused by ModelDirError, a version's parts opened."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError
from server_helpers import copy_version

from offgraph.export.export import export_run
from offgraph.export.synth import synth_version
from offgraph.export.synth_config import SynthConfig
from offgraph.modeldir.manifest import MANIFEST, ModelDirError, load_manifest
from offgraph.modeldir.manifest_model import Manifest
from offgraph.modeldir.version import ModelVersion


def on_disk(vdir) -> dict:
    return json.loads((vdir / MANIFEST).read_text())


@pytest.fixture(scope="module")
def version(tiny_model):
    return tiny_model[0] / "ml" / "1"


def test_the_manifest_is_frozen(version):
    m = load_manifest(version, verify_dense=False)
    assert isinstance(m, Manifest)
    with pytest.raises(ValidationError, match="frozen"):
        m.embedding_dim = 3
    with pytest.raises(ValidationError, match="frozen"):
        m.store.quant = "int8"
    with pytest.raises(ValidationError, match="frozen"):
        m.fields[0].rows = 1
    assert m.embedding_dim == on_disk(version)["embedding_dim"] and m.store.quant == "fp32"


def test_what_the_exporter_writes_reads_back_unchanged(tiny_model, numeric_run, tmp_path):
    """The tiny model (feature tables) and the numeric one (a dense input): the manifest ``export_run``
    returns, and the one ``load_manifest`` reads, dump to the JSON on disk."""
    run, _ = numeric_run
    for src, out in ((tiny_model[0].parent / "run", tmp_path / "ml" / "1"), (run, tmp_path / "num" / "1")):
        returned = export_run(src, out, shards=2, quant="int8", progress=False)
        assert isinstance(returned, Manifest)
        want = on_disk(out)
        assert returned.to_dict() == want
        assert load_manifest(out).to_dict() == want
    m = load_manifest(tmp_path / "num" / "1")
    assert [d["name"] for d in m.dense_inputs] == ["movie_prior_mean"] and m.feature_tables is None
    assert load_manifest(tmp_path / "ml" / "1").feature_tables  # the example spec's user and item tables
    assert m.store.total_rows == sum(f.rows for f in m.fields) and m.training_loss == "pointwise"


def test_what_synth_writes_reads_back_unchanged(tmp_path):
    out = tmp_path / "scale" / "1"
    returned = synth_version(out, SynthConfig(rows=60_000, seed=3, shards=2), progress=False)
    want = on_disk(out)
    assert returned.to_dict() == want and load_manifest(out).to_dict() == want
    assert returned.training["synthetic"]["seed"] == 3 and returned.export_seconds.store > 0


def test_keys_this_offgraph_does_not_know_are_kept(version, tmp_path):
    def newer(m):
        m["from_a_newer_exporter"] = {"x": [1, 2.5, None]}
        m["store"]["a_new_setting"] = "on"
        m["fields"][0]["note"] = "kept"

    copy_version(version, tmp_path / "ml" / "1", manifest_edit=newer)
    m = load_manifest(tmp_path / "ml" / "1", verify_dense=False)
    assert m.to_dict() == on_disk(tmp_path / "ml" / "1")
    assert m.from_a_newer_exporter == {"x": [1, 2.5, None]} and m.store.a_new_setting == "on"


def _pop(path):
    def edit(m):
        *parents, last = path
        for p in parents:
            m = m[p]
        m.pop(last)

    return edit


def _set(path, value):
    def edit(m):
        *parents, last = path
        for p in parents:
            m = m[p]
        m[last] = value

    return edit


@pytest.mark.parametrize(
    "edit, match",
    [
        # the messages of the checks that read the dict, unchanged
        (_pop(["spec"]), "manifest lacks 'spec'"),
        (_pop(["fields"]), "manifest lacks 'fields'"),
        (_pop(["embedding_dim"]), "manifest lacks 'embedding_dim'"),
        (_pop(["store"]), "manifest lacks 'store'"),
        (_pop(["checksums"]), "manifest lacks 'checksums'"),
        (_set(["format_version"], 2), "format_version 2, this offgraph reads 1"),
        (_set(["fg_version"], "offgraph-fg-0"), "FG version 'offgraph-fg-0' differs"),
        # the same wording for a typed field's key deeper down, and a value of the wrong JSON type
        (_pop(["store", "shards"]), "manifest lacks 'store.shards'"),
        (_pop(["fields", 1, "rows"]), "manifest lacks 'fields.1.rows'"),
        (_set(["embedding_dim"], "16"), "manifest's 'embedding_dim' is '16': input should be a valid integer"),
        (_set(["fields", 0, "rows"], 1.5), "manifest's 'fields.0.rows' is 1.5: input should be a valid integer"),
        (_set(["store", "quant"], None), "manifest's 'store.quant' is None: input should be a valid string"),
        (_set(["checksums", "dense"], []), "manifest's 'checksums.dense' is \\[\\]: input should be an object"),
    ],
)
def test_an_ill_formed_manifest_is_refused_with_what_is_wrong(version, tmp_path, edit, match):
    copy_version(version, tmp_path / "ml" / "1", manifest_edit=edit)
    with pytest.raises(ModelDirError, match=f"manifest.json: {match}"):
        load_manifest(tmp_path / "ml" / "1", verify_dense=False)
    with pytest.raises(ModelDirError, match=match):
        ModelVersion.open(tmp_path / "ml" / "1")


def test_model_version_opens_manifest_spec_store_and_dense_head(version):
    mv = ModelVersion.open(version)
    assert mv.version == 1 and mv.manifest == load_manifest(version)
    assert not {"spec", "store", "dense"} & set(vars(mv))  # nothing heavy opened yet
    m = mv.manifest
    assert mv.spec.field_names == m.field_names() and mv.spec.model.embedding_dim == m.embedding_dim
    with mv:
        v, w = mv.store.read(0, np.arange(4))
        assert v.shape == (4, m.embedding_dim) and w.shape == (4,) and mv.store.codec.name == m.store.quant
        assert mv.store.config.shards == m.store.shards
    assert "store" not in vars(mv)  # closed with the version
    loaded, serve = mv.dense
    n = len(m.fields)
    inputs = {"emb": np.zeros([2, n, m.embedding_dim], np.float32), "first_order": np.zeros([2, n], np.float32)}
    if mv.spec.numeric:
        inputs["dense"] = np.zeros([2, len(mv.spec.numeric)], np.float32)
    ctr = serve(**inputs)["ctr"].numpy()
    assert ctr.shape == (2,) and np.all((0 < ctr) & (ctr < 1))
    with mv.open_store("r") as st:  # a handle of its own, with the recorded settings
        np.testing.assert_array_equal(st.read(0, np.arange(4))[0], v)
