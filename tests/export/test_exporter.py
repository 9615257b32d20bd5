import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from server_helpers import copy_version

from offgraph.export.check import run_check
from offgraph.export.export import export_run
from offgraph.modeldir.manifest import ModelDirError, complete_versions, load_manifest
from offgraph.scoring.scorer import load

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(numeric_run, tmp_path_factory):
    """fp32 (1) and int8 (2) exports of a run whose spec has a continuous field."""
    run, _ = numeric_run
    models = tmp_path_factory.mktemp("models")
    export_run(run, models / "ml" / "1", shards=4, quant="fp32", progress=False)
    export_run(run, models / "ml" / "2", shards=4, quant="int8", progress=False)
    return models / "ml"


def test_fp32_parity_on_real_held_out_rows(numeric_run, exported):
    """The example spec has a continuous field (movie_prior_mean, standardized): parity covers it."""
    run, table = numeric_run
    m = load_manifest(exported / "1")
    assert [d["name"] for d in m["dense_inputs"]] == ["movie_prior_mean"]
    assert m["dense"]["signature"]["inputs"]["dense"]["shape"] == [None, 1]
    res = run_check(exported / "1", run, table, limit=3000)
    assert res["rows"] == 3000 and res["requests"] > 10 and res["row_set"] == "held-out"
    assert res["max_abs_dp"] <= 1e-5, res
    assert res["derived_max_diff"] == 1e-5 and res["quant_max_abs_dp"] == 0.0
    assert abs(res["auc_delta"]) < 1e-6


def test_int8_close_to_fp32(numeric_run, exported):
    run, table = numeric_run
    res = run_check(exported / "2", run, table, limit=3000)
    assert res["max_abs_dp"] < 0.01 and abs(res["auc_delta"]) < 0.002, res
    # the default tolerance: what the int8 codec alone does to the Keras model's scores, + 1e-5
    assert 1e-5 < res["derived_max_diff"] < 0.01 and res["max_abs_dp"] <= res["derived_max_diff"], res
    fp32 = load_manifest(exported / "1")["store"]["bytes_on_disk"]
    int8 = load_manifest(exported / "2")["store"]["bytes_on_disk"]
    assert int8 < 0.45 * fp32


def test_manifest_records_what_lookups_need(numeric_run, exported):
    run, _ = numeric_run
    m = json.loads((exported / "1" / "manifest.json").read_text())
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    assert m["spec"] == spec
    assert m["hash"] == spec["model"]["hash"] and m["embedding_dim"] == 16
    tables = [f for f in spec["fields"] if f["op"] != "numeric"]
    assert [f["name"] for f in m["fields"]] == [f["name"] for f in tables]
    assert m["store"]["row_counts"] == {f["name"]: f["rows"] for f in tables}
    assert m["segmenters"] == {}  # no tokenize field in the MovieLens spec
    stats = [f for f in spec["fields"] if f["op"] == "numeric"][0]["stats"]
    assert m["dense_inputs"][0]["stats"] == stats and stats["std"] > 0
    assert m["store"]["shards"] == 4 and m["store"]["quant"] == "fp32"
    assert m["dense"]["signature"]["inputs"]["emb"]["shape"] == [None, len(tables), 16]
    assert set(m["checksums"]["dense"]) and m["fg_version"]
    assert "auc" in m["training"]["held_out"]


def test_dense_savedmodel_loads_in_fresh_process_without_embedding_tables(exported, numeric_run):
    code = r"""
import json, sys, numpy as np, tensorflow as tf
m = tf.saved_model.load(sys.argv[1])
sig = m.signatures["serving_default"]
saved = [(n, s) for n, s in tf.train.list_variables(sys.argv[1] + "/variables/variables")
         if not n.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")]
out = sig(emb=tf.zeros([3, int(sys.argv[2]), 16]), first_order=tf.zeros([3, int(sys.argv[2])]), dense=tf.zeros([3, 1]))
print(json.dumps({"shapes": [s for _, s in saved], "names": [n for n, _ in saved],
                  "captured": len(sig.variables), "ctr": out["ctr"].numpy().tolist()}))
"""
    F = len(load_manifest(exported / "1")["fields"])
    r = subprocess.run(
        [sys.executable, "-c", code, str(exported / "1" / "dense"), str(F)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got["ctr"]) == 3 and all(0 < p < 1 for p in got["ctr"])
    rows = {f["rows"] for f in load_manifest(exported / "1")["fields"]}
    for shape, name in zip(got["shapes"], got["names"]):
        assert not (shape and shape[0] in rows and len(shape) == 2 and shape[1] in (1, 16)), (name, shape)
        assert "emb_" not in name and "/w_" not in name
    assert got["captured"] == len(got["shapes"]) == 8  # 3 dense layers x (kernel, bias) + bias + dense_w
    n_params = sum(int(np.prod(s)) for s in got["shapes"])
    assert n_params < (F * 16 + 1) * 64 + 64 * 32 + 32 + 64 + 100  # the MLP, bias and the numeric weight only


def test_version_without_manifest_is_not_loadable(exported, tmp_path):
    partial = tmp_path / "ml" / "7"
    shutil.copytree(exported / "1", partial)
    (partial / "manifest.json").unlink()
    assert complete_versions(tmp_path / "ml") == []
    with pytest.raises(ModelDirError, match="incomplete"):
        load_manifest(partial)
    with pytest.raises(ModelDirError, match="no complete version"):
        load(tmp_path / "ml")


def test_tampered_dense_or_missing_shard_refused(exported, tmp_path):
    bad = tmp_path / "ml" / "3"
    shutil.copytree(exported / "1", bad)
    with open(bad / "dense" / "saved_model.pb", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ModelDirError, match="checksum mismatch"):
        load_manifest(bad)
    miss = tmp_path / "ml" / "4"
    shutil.copytree(exported / "1", miss)
    shutil.rmtree(miss / "store" / "shard-002")
    with pytest.raises(ModelDirError, match="missing store shard 2"):
        load_manifest(miss)


def test_interrupted_export_leaves_no_loadable_version(small_run, tmp_path, monkeypatch):
    import offgraph.export.export as ex

    def boom(*a, **k):
        raise RuntimeError("killed mid-export")

    monkeypatch.setattr(ex, "save_dense", boom)
    with pytest.raises(RuntimeError):
        ex.export_run(small_run[0], tmp_path / "ml" / "1", shards=2, quant="fp32", progress=False)
    assert (tmp_path / "ml" / "1" / "store").exists()
    assert complete_versions(tmp_path / "ml") == []
    monkeypatch.undo()
    ex.export_run(small_run[0], tmp_path / "ml" / "1", shards=2, quant="fp32", progress=False)  # redo cleans up
    assert complete_versions(tmp_path / "ml") == [1]
    with pytest.raises(ValueError, match="immutable"):
        ex.export_run(small_run[0], tmp_path / "ml" / "1", shards=2, quant="fp32", progress=False)


def test_exporter_refuses_run_whose_spec_and_model_disagree(small_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(small_run[0], run)
    spec = yaml.safe_load((run / "spec.yaml").read_text())
    spec["fields"][0]["rows"] += 1
    (run / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(ValueError, match="weights do not match|field 'user_id'"):
        export_run(run, tmp_path / "m" / "1", progress=False)
    assert not (tmp_path / "m" / "1" / "manifest.json").exists()


def test_scorer_scores_in_candidate_order_and_handles_missing(exported):
    with load(exported) as s:
        assert s.version == 2
        req = {"user_id": 1, "age": 24, "gender": "M", "occupation": "technician", "zip_prefix": "857"}
        cands = [{"movie_id": 50, "genres": ["Action", "Sci-Fi"], "title_words": ["star", "wars"]}, {"movie_id": 1}, {}]
        p = s.score(req, cands)
        assert p.shape == (3,) and np.all((p > 0) & (p < 1))
        p_rev = s.score(req, cands[::-1])
        np.testing.assert_allclose(p_rev[::-1], p, rtol=1e-6)


def test_segmenter_recorded_and_checked_at_load(exported, tmp_path):
    """A model whose tokenize field was segmented by another jieba version is refused; a manifest without
    the segmenter record (older exports) means whitespace."""

    def with_query(m, seg, record):
        m["spec"]["fields"].append(
            {
                "name": "query",
                "scope": "request",
                "op": "tokenize",
                "input": "query",
                "rows": 16,
                **({"segmenter": seg} if seg else {}),
            }
        )
        m["fields"].append(
            {
                "name": "query",
                "table_id": len(m["fields"]),
                "rows": 16,
                "scope": "request",
                "op": "tokenize",
                "pooling": "mean",
            }
        )
        if record is None:
            m.pop("segmenters", None)
        else:
            m["segmenters"] = {"query": record}

    import jieba

    cases = [
        (
            "jieba",
            {"name": "jieba", "library": "jieba", "version": "0.1", "hmm": False},
            f"field 'query' was segmented by .*'0.1'.*this process has .*'{jieba.__version__}'",
        ),
        ("jieba", None, "segmented by \\{'name': 'whitespace'\\}"),
    ]
    for i, (seg, record, match) in enumerate(cases):
        d = tmp_path / "ml" / str(10 + i)
        copy_version(exported / "1", d, manifest_edit=lambda m: with_query(m, seg, record))
        with pytest.raises(ModelDirError, match=match):
            load(d, verify=False)


def test_check_cli_defaults(numeric_run, exported, tmp_path):
    """`offgraph check` without --rows / --max-diff: all rows of a file that is not the training file, and the
    tolerance derived from the quantization."""
    import pyarrow.parquet as pq

    run, table = numeric_run
    other = tmp_path / "other.parquet"
    pq.write_table(table.slice(0, 400), other)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "offgraph.cli",
            "check",
            "--model",
            str(exported / "2"),
            "--run",
            str(run),
            "--data",
            str(other),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "400 all rows" in r.stdout and "derived from int8" in r.stdout, r.stdout


def test_a_run_written_by_the_library_records_the_segmenters_its_spec_implies(tmp_path):
    """A run built by hand (a model of a spec with a `cjk` tokenize field, no metrics) through the library's run
    writer exports, records the cjk segmenter in the manifest, and scores; it was once refused as "segmented
    by whitespace at training"."""
    from offgraph.features import parse_spec
    from offgraph.model.model import build_deepfm, load_run
    from offgraph.model.train import TrainConfig, write_run

    spec = parse_spec(
        {
            "model": {"embedding_dim": 4, "mlp": [8]},
            "label": "y",
            "fields": [
                {
                    "name": "query",
                    "scope": "request",
                    "op": "tokenize",
                    "input": "query",
                    "segmenter": "cjk",
                    "rows": 64,
                },
                {"name": "item", "scope": "item", "op": "id", "input": "item", "rows": 32},
            ],
        },
        source="hand-built",
    )
    write_run(tmp_path / "run", build_deepfm(spec), spec, TrainConfig(), metrics={})
    m = export_run(tmp_path / "run", tmp_path / "models" / "hand" / "1", shards=1, quant="fp32", progress=False)
    assert m["segmenters"] == {"query": {"name": "cjk"}}
    assert load_run(tmp_path / "run")[2]["segmenters"] == {"query": {"name": "cjk"}}
    with load(tmp_path / "models" / "hand" / "1") as s:
        p = s.score({"query": "東京 ramen"}, [{"item": 1}, {"item": 2}])
    assert p.shape == (2,) and np.all((p > 0) & (p < 1))
