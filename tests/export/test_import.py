"""`offgraph import` (issue 54 item 1): a DeepFM written here in plain Keras (not with offgraph.model), with
vocabulary-indexed embeddings (Keras StringLookup: unknown id -> index 0, key i -> i + 1, the spec's
vocabulary rows), one hashed field and its own numeric input, trained one epoch on MovieLens, then imported
two ways: the whole Keras model (split by the importer), and its tables as Parquet with the dense head
saved apart (a Keras file, and a SavedModel). Served scores (a real uvicorn server, and the library scorer)
are compared with the Keras model's own predictions on 2,000 held-out rows. Then one test per refusal."""

import json
import shutil
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from server_helpers import model_server, score

from offgraph.cli import main
from offgraph.export.check import run_check
from offgraph.export.import_model import ImportRefused, import_model, imported_reference
from offgraph.features.hashing import row_of
from offgraph.features.spec import SpecError
from offgraph.features.vocabulary import write_vocabulary
from offgraph.scoring.scorer import load

D = 8
TRAIN_ROWS, HELD_OUT = 28000, 2000
REQUEST_INPUTS, ITEM_INPUTS = ("user_id", "occupation", "gender"), ("movie_id", "movie_prior_mean")
VOCAB_FIELDS = {"user": "user_id", "occupation": "occupation", "movie": "movie_id"}
GENDER_ROWS = 16


def _spec_text(mean: float, std: float) -> str:
    return f"""
model: {{embedding_dim: {D}, mlp: [16]}}
label: label
group: request_id
item_key: movie_id
fields:
  - {{name: user, scope: request, op: id, input: user_id, vocabulary: user.txt}}
  - {{name: occupation, scope: request, op: id, input: occupation, vocabulary: occupation.txt}}
  - {{name: gender, scope: request, op: id, input: gender, rows: {GENDER_ROWS}}}
  - {{name: movie, scope: item, op: id, input: movie_id, vocabulary: movie.txt}}
  - {{name: prior, scope: item, op: numeric, input: movie_prior_mean, transform: [standardize], stats: {{mean: {mean!r}, std: {std!r}}}}}
"""


def _keras_inputs(table: pa.Table, mean: float, std: float) -> dict:
    """The Keras model's inputs, computed here: ids as strings (the StringLookup layers map them), gender
    hashed as the spec's hashed field, the numeric input standardized with the spec's statistics."""
    x = {
        name: np.asarray([str(v) for v in table.column(col).to_pylist()], str)[:, None]
        for name, col in VOCAB_FIELDS.items()
    }
    x["gender"] = np.asarray([row_of(g, "xxh64", GENDER_ROWS) for g in table.column("gender").to_pylist()])[:, None]
    prior = np.asarray(table.column("movie_prior_mean").to_pylist(), np.float64)
    x["numeric"] = np.nan_to_num((prior - mean) / std, nan=0.0).astype(np.float32)[:, None]  # none yet: 0
    return x


def _head(num_fields: int):
    """The DeepFM head: bias + first order + FM + a one-layer MLP over the flat embeddings and the numeric
    input; takes [emb, first_order, dense] and returns the logit."""
    import keras
    from keras import layers, ops

    emb = keras.Input((num_fields, D), name="emb")
    fo = keras.Input((num_fields,), name="first_order")
    dense = keras.Input((1,), name="dense")
    s = ops.sum(emb, axis=1)
    fm = 0.5 * ops.sum(ops.square(s) - ops.sum(ops.square(emb), axis=1), axis=1, keepdims=True)
    hidden = layers.Dense(16, activation="relu", name="mlp_hidden")(
        layers.Concatenate()([layers.Flatten()(emb), dense])
    )
    mlp = layers.Dense(1, name="mlp_out")(hidden)
    logit = layers.Add()([ops.sum(fo, axis=1, keepdims=True), fm, mlp])
    return keras.Model([emb, fo, dense], logit, name="head")


def _deepfm(vocabs: dict[str, list[str]], names: dict[str, str] | None = None):
    import keras
    from keras import layers

    inputs, embs, fos = [], [], []
    for name in ("user", "occupation", "gender", "movie"):
        if name in vocabs:
            x = keras.Input((1,), dtype="string", name=name)
            idx = layers.StringLookup(vocabulary=vocabs[name], name=f"{name}_lookup")(x)
            rows = len(vocabs[name]) + 1
        else:
            x = idx = keras.Input((1,), dtype="int64", name=name)
            rows = GENDER_ROWS
        inputs.append(x)
        embs.append(layers.Embedding(rows, D, name=(names or {}).get(name, f"{name}_emb"))(idx))
        fos.append(layers.Embedding(rows, 1, name=f"{name}_first_order")(idx))
    numeric = keras.Input((1,), name="numeric")
    emb = layers.Concatenate(axis=1)(embs)
    fo = layers.Reshape((len(embs),))(layers.Concatenate(axis=1)(fos))
    head = _head(len(embs))
    out = layers.Activation("sigmoid")(head([emb, fo, numeric]))
    return keras.Model([*inputs, numeric], out), head


@pytest.fixture(scope="module")
def trained(movielens_table, tmp_path_factory):
    """The Keras model trained one epoch on the first 28,000 ratings, its files and spec: a dict."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(7)
    root = tmp_path_factory.mktemp("import")
    table = movielens_table.slice(0, TRAIN_ROWS + HELD_OUT)
    train, held = table.slice(0, TRAIN_ROWS), table.slice(TRAIN_ROWS, HELD_OUT)
    vocabs = {}
    for name, col in VOCAB_FIELDS.items():
        keys = sorted({str(v) for v in train.column(col).to_pylist()})
        write_vocabulary(root / f"{name}.txt", keys)
        vocabs[name] = keys
    prior = np.asarray(train.column("movie_prior_mean").to_pylist(), np.float64)  # NaN: a movie's first ratings
    mean, std = float(np.nanmean(prior)), float(np.nanstd(prior))
    (root / "spec.yaml").write_text(_spec_text(mean, std))
    model, head = _deepfm(vocabs)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    y = np.asarray(train.column("label").to_pylist(), np.float32)
    model.fit(
        tf.data.Dataset.from_tensor_slices((_keras_inputs(train, mean, std), y)).shuffle(TRAIN_ROWS, seed=7).batch(512),
        epochs=1,
        verbose=0,
    )
    model.save(root / "deepfm.keras")
    head.save(root / "head.keras")
    head.export(str(root / "head_saved_model"), verbose=False)
    tables = root / "tables"
    tables.mkdir()
    for name in ("user", "occupation", "gender", "movie"):
        v = model.get_layer(f"{name}_emb").get_weights()[0]
        w = model.get_layer(f"{name}_first_order").get_weights()[0][:, 0]
        if name in vocabs:  # keyed by the vocabulary, the unknown row (index 0) as a null key
            index = pa.array([None, *vocabs[name]], pa.string())
            col = "key"
        else:
            index, col = pa.array(np.arange(len(v))), "row"
        t = pa.table({col: index, "vector": pa.array(list(v), pa.list_(pa.float32())), "first_order": w})
        if name == "gender":  # an Arrow file beside the Parquet ones
            with pa.ipc.new_file(tables / "gender.arrow", t.schema) as f:
                f.write_table(t)
        else:
            pq.write_table(t, tables / f"{name}.parquet")
    p_keras = model.predict(tf.data.Dataset.from_tensor_slices(_keras_inputs(held, mean, std)).batch(4096), verbose=0)[
        :, 0
    ]
    pq.write_table(held, root / "held.parquet")
    return {"root": root, "held": held, "p_keras": p_keras, "vocabs": vocabs, "mean": mean, "std": std}


def _requests(held: pa.Table):
    """(request, candidates, row positions) of the held-out rows, grouped by request_id."""
    cols = {c: held.column(c).to_pylist() for c in (*REQUEST_INPUTS, *ITEM_INPUTS, "request_id")}
    groups: dict[str, list[int]] = {}
    for i, rid in enumerate(cols["request_id"]):
        groups.setdefault(rid, []).append(i)
    for rows in groups.values():
        request = {c: cols[c][rows[0]] for c in REQUEST_INPUTS}
        yield request, [{c: cols[c][i] for c in ITEM_INPUTS} for i in rows], np.asarray(rows)


def _served(version: Path, held: pa.Table) -> np.ndarray:
    out = np.zeros(held.num_rows, np.float32)
    with load(version) as s:
        for request, cands, rows in _requests(held):
            out[rows] = s.score(request, cands)
    return out


@pytest.fixture(scope="module")
def whole(trained):
    """The whole Keras model imported: int8 (1) and fp32 (2, the newest: the one a server serves)."""
    root = trained["root"]
    models = root / "models_whole"
    for v, quant in (("1", "int8"), ("2", "fp32")):
        import_model(
            root / "spec.yaml",
            models / "ml" / v,
            keras_model=root / "deepfm.keras",
            quant=quant,
            shards=2,
            progress=False,
        )
    return models


def test_whole_keras_model_fp32_served_equals_keras(trained, whole, tmp_path):
    held, p_keras = trained["held"], trained["p_keras"]
    assert held.num_rows == HELD_OUT
    # some held-out users and movies are not in the vocabularies (first seen after row 28,000): both sides
    # look them up on row 0
    users = set(trained["vocabs"]["user"])
    unseen = sum(str(u) not in users for u in held.column("user_id").to_pylist())
    movies = set(trained["vocabs"]["movie"])
    unseen_movies = sum(str(m) not in movies for m in held.column("movie_id").to_pylist())
    assert unseen_movies > 0 and unseen > 0
    with model_server(whole, tmp_path) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        served = np.zeros(HELD_OUT, np.float32)
        for request, cands, rows in _requests(held):
            r = score(c, {"request": request, "candidates": cands})
            assert r.status_code == 200, r.text
            served[rows] = r.json()["scores"]
        metrics = c.get("/metrics").text
    assert np.abs(served.astype(np.float64) - p_keras).max() <= 1e-5
    unknown = {
        x.split('field="')[1].split('"')[0]: float(x.split()[-1])
        for x in metrics.splitlines()
        if x.startswith("offgraph_vocabulary_unknown_total{") and 'model="ml"' in x
    }
    # request fields are computed once a request: each request of an unseen user counts once; a movie once
    # per candidate the item cache did not hold (at least once per distinct unseen movie, at most every row)
    requests_unseen = {
        r
        for r, u in zip(held.column("request_id").to_pylist(), held.column("user_id").to_pylist())
        if str(u) not in users
    }
    distinct_movies = {m for m in held.column("movie_id").to_pylist() if str(m) not in movies}
    assert unknown.get("user", 0.0) == len(requests_unseen)
    assert len(distinct_movies) <= unknown["movie"] <= unseen_movies
    assert "occupation" not in unknown  # every occupation is in its vocabulary
    m = json.loads((whole / "ml" / "2" / "manifest.json").read_text())
    assert m["vocabularies"]["movie"]["keys"] == len(movies)
    assert (whole / "ml" / "2" / m["vocabularies"]["movie"]["path"]).read_text().splitlines() == trained["vocabs"][
        "movie"
    ]
    assert m["training"]["imported"]["keras_model"]["path"] == str((trained["root"] / "deepfm.keras").resolve())
    assert m["spec"]["fields"][3]["vocabulary"] == "vocabulary/movie.txt"


def test_whole_keras_model_int8_within_the_usual_bound(trained, whole):
    served = _served(whole / "ml" / "1", trained["held"])
    dp = np.abs(served.astype(np.float64) - trained["p_keras"]).max()
    res = run_check(
        whole / "ml" / "1", None, trained["held"], limit=0, reference=imported_reference(whole / "ml" / "1")
    )
    assert res["rows"] == HELD_OUT and res["quant"] == "int8"
    assert 1e-5 < res["derived_max_diff"] < 0.01
    assert dp <= res["derived_max_diff"] and res["max_abs_dp"] <= res["derived_max_diff"]


@pytest.mark.parametrize("head", ["head.keras", "head_saved_model"])
def test_parquet_tables_and_a_separate_head(trained, tmp_path, head):
    root = trained["root"]
    out = tmp_path / "ml" / "1"
    _, checked = import_model(
        root / "spec.yaml",
        out,
        tables=[root / "tables"],
        dense=root / head,
        quant="fp32",
        shards=2,
        progress=False,
        check_rows=trained["held"],
    )
    assert checked["rows"] == HELD_OUT and checked["max_abs_dp"] <= 1e-5
    served = _served(out, trained["held"])
    assert np.abs(served.astype(np.float64) - trained["p_keras"]).max() <= 1e-5
    m = json.loads((out / "manifest.json").read_text())
    assert sorted(m["training"]["imported"]["tables"]) == ["gender", "movie", "occupation", "user"]


def test_cli_import_then_check(trained, tmp_path, capsys):
    root = trained["root"]
    out = tmp_path / "ml" / "3"
    rc = main(
        [
            "import",
            "--spec",
            str(root / "spec.yaml"),
            "--tables",
            str(root / "tables"),
            "--dense",
            str(root / "head.keras"),
            "--out",
            str(out),
            "--quant",
            "int8",
            "--shards",
            "2",
            "--no-progress",
            "--check-rows",
            str(root / "held.parquet"),
        ]
    )
    assert rc == 0, capsys.readouterr()
    assert "check on 2000 rows" in capsys.readouterr().out
    rc = main(["check", "--model", str(out), "--data", str(root / "held.parquet")])
    text = capsys.readouterr().out
    assert rc == 0 and "2000 all rows" in text and "OK: max |dp|" in text, text


# -- refusals ------------------------------------------------------------------------------------------------
def _tables_copy(trained, tmp_path) -> Path:
    dst = tmp_path / "tables"
    shutil.copytree(trained["root"] / "tables", dst)
    return dst


def _import(trained, tmp_path, **kw):
    root = trained["root"]
    kw.setdefault("tables", [root / "tables"])
    kw.setdefault("dense", root / "head.keras")
    return import_model(kw.pop("spec", root / "spec.yaml"), tmp_path / "ml" / "1", progress=False, **kw)


def test_refuses_a_table_of_another_width(trained, tmp_path):
    tables = _tables_copy(trained, tmp_path)
    t = pq.read_table(tables / "occupation.parquet")
    wide = [list(v) + [0.0] for v in t.column("vector").to_pylist()]
    pq.write_table(t.set_column(1, "vector", pa.array(wide, pa.list_(pa.float32()))), tables / "occupation.parquet")
    with pytest.raises(
        ImportRefused, match=r"occupation.parquet \(field 'occupation'\): vectors are 9 wide .* embedding_dim is 8"
    ):
        _import(trained, tmp_path, tables=[tables])
    assert not (tmp_path / "ml" / "1").exists()  # refused before anything was written


def test_refuses_a_dense_head_of_another_signature(trained, tmp_path):
    import keras

    emb, fo, dense = keras.Input((5, D)), keras.Input((5,)), keras.Input((1,))  # 5 fields, the spec has 4
    flat = keras.layers.Concatenate()([keras.layers.Flatten()(emb), fo, dense])
    keras.Model([emb, fo, dense], keras.layers.Dense(1)(flat)).save(tmp_path / "five.keras")
    with pytest.raises(
        ImportRefused,
        match=r"dense head .*five.keras: does not take emb \[N, 4, 8\], first_order \[N, 4\], dense \[N, 1\]",
    ):
        _import(trained, tmp_path, dense=tmp_path / "five.keras")
    emb, fo, dense = keras.Input((4, D)), keras.Input((4,)), keras.Input((1,))
    flat = keras.layers.Concatenate()([keras.layers.Flatten()(emb), fo, dense])
    keras.Model([emb, fo, dense], keras.layers.Dense(3)(flat)).save(tmp_path / "three.keras")
    with pytest.raises(
        ImportRefused, match=r"three.keras: given .* with N=2 it returned \(2, 3\), not one score a row"
    ):
        _import(trained, tmp_path, dense=tmp_path / "three.keras")


def test_refuses_a_vocabulary_with_a_duplicate_key(trained, tmp_path):
    root = trained["root"]
    for name in ("user", "occupation"):
        shutil.copy(root / f"{name}.txt", tmp_path / f"{name}.txt")
    movies = trained["vocabs"]["movie"]
    write_vocabulary(tmp_path / "movie.txt", [*movies, movies[10]])
    shutil.copy(root / "spec.yaml", tmp_path / "spec.yaml")
    with pytest.raises(
        SpecError,
        match=rf"field 'movie': vocabulary .*movie.txt: duplicate key '{movies[10]}' \(rows 11 and {len(movies) + 1}\)",
    ):
        _import(trained, tmp_path, spec=tmp_path / "spec.yaml")


def test_refuses_fields_that_do_not_match_the_tables(trained, tmp_path):
    tables = _tables_copy(trained, tmp_path)
    (tables / "gender.arrow").rename(tmp_path / "gender.arrow")
    with pytest.raises(ImportRefused, match=r"field 'gender': no table among"):
        _import(trained, tmp_path, tables=[tables])
    with pytest.raises(ImportRefused, match=r"table .*age.parquet: the spec has no field 'age'"):
        shutil.copy(tables / "user.parquet", tables / "age.parquet")
        _import(trained, tmp_path, tables=[tables, tmp_path / "gender.arrow"])
    (tables / "age.parquet").unlink()
    t = pq.read_table(tables / "movie.parquet")
    pq.write_table(t.slice(0, t.num_rows - 3), tables / "movie.parquet")  # three keys short
    n = len(trained["vocabs"]["movie"]) + 1
    with pytest.raises(
        ImportRefused, match=rf"movie.parquet \(field 'movie'\): {n - 3:,} rows, but the spec's table has {n:,}"
    ):
        _import(trained, tmp_path, tables=[tables, tmp_path / "gender.arrow"])


def test_refuses_a_whole_model_without_a_fields_layers(trained, tmp_path):
    model, _ = _deepfm(trained["vocabs"], names={"movie": "film_emb"})
    model.save(tmp_path / "renamed.keras")
    with pytest.raises(ImportRefused, match=r"field 'movie' has no Embedding layer named 'movie_emb'"):
        _import(trained, tmp_path, tables=None, dense=None, keras_model=tmp_path / "renamed.keras")


@pytest.mark.parametrize("source", ["tables", "keras"])
def test_a_vocabulary_with_capacity_imports_without_its_reserved_rows(trained, tmp_path, source):
    """``capacity: 5`` on the movie field: the tables (and the whole model's layers) have the vocabulary's rows
    only; the version has 5 more, each holding the unknown row's values, and serves as the Keras model does."""
    from offgraph.store import open_store

    root = tmp_path / "spec"
    shutil.copytree(trained["root"], root, ignore=shutil.ignore_patterns("models*"))
    text = (root / "spec.yaml").read_text().replace("vocabulary: movie.txt}", "vocabulary: movie.txt, capacity: 5}")
    (root / "spec.yaml").write_text(text)
    out = tmp_path / "ml" / "1"
    if source == "tables":
        import_model(
            root / "spec.yaml", out, tables=[root / "tables"], dense=root / "head.keras", quant="fp32", progress=False
        )
    else:
        import_model(root / "spec.yaml", out, keras_model=root / "deepfm.keras", quant="fp32", progress=False)
    v = len(trained["vocabs"]["movie"])
    with open_store(out / "store") as st:
        vec, w, found = st.read_unique(np.full(v + 6, 3, np.uint32), np.arange(v + 6))
    assert found.all()
    np.testing.assert_array_equal(vec[v + 1 :], np.repeat(vec[:1], 5, 0))
    np.testing.assert_array_equal(w[v + 1 :], np.repeat(w[:1], 5))
    np.testing.assert_allclose(_served(out, trained["held"]), trained["p_keras"], atol=1e-5)
