"""A vocabulary field through `offgraph train` and `offgraph export`: the run trains on the vocabulary's rows,
the version holds its own copy of the file (recorded with its sha256), and the served scores equal the
Keras model's (fp32) on the held-out rows, unseen ids included (row 0 on both sides)."""

import hashlib
import json

import numpy as np

from offgraph.export.check import run_check
from offgraph.export.export import export_run
from offgraph.features import load_spec
from offgraph.features.vocabulary import write_vocabulary
from offgraph.model.train import TrainConfig, train_run
from offgraph.scoring.scorer import load


def test_train_export_check_with_vocabulary_fields(movielens_table, tmp_path):
    table = movielens_table.slice(0, 8000)
    # the vocabularies of the first 4,000 rows: later users and movies are unknown (row 0)
    first = table.slice(0, 4000)
    users = sorted({str(u) for u in first.column("user_id").to_pylist()})
    movies = sorted({str(m) for m in first.column("movie_id").to_pylist()})
    write_vocabulary(tmp_path / "users.txt", users)
    write_vocabulary(tmp_path / "movies.txt", movies)
    (tmp_path / "spec.yaml").write_text(
        "model: {embedding_dim: 4, mlp: [8]}\nlabel: label\ntime: timestamp\nsplit_key: user_id\nfields:\n"
        "  - {name: user, scope: request, op: id, input: user_id, vocabulary: users.txt}\n"
        "  - {name: gender, scope: request, op: id, input: gender, rows: 10}\n"
        "  - {name: movie, scope: item, op: id, input: movie_id, vocabulary: movies.txt}\n"
    )
    spec = load_spec(tmp_path / "spec.yaml")
    assert [f.rows for f in spec.fields] == [len(users) + 1, 10, len(movies) + 1]
    run = tmp_path / "run"
    train_run(spec, table, TrainConfig(epochs=1, split="per-key-time"), run, progress=False)
    out = tmp_path / "models" / "ml" / "1"
    export_run(run, out, shards=2, quant="fp32", progress=False)
    m = json.loads((out / "manifest.json").read_text())
    want = hashlib.sha256((tmp_path / "movies.txt").read_bytes()).hexdigest()
    assert m["vocabularies"]["movie"] == {"path": "vocabulary/movie.txt", "sha256": want, "keys": len(movies)}
    assert (out / "vocabulary" / "movie.txt").read_bytes() == (tmp_path / "movies.txt").read_bytes()
    assert "vocabulary/movie.txt" in m["checksums"]["files"]
    res = run_check(out, run, table, limit=0)
    assert res["row_set"] == "held-out" and res["rows"] > 500
    assert res["max_abs_dp"] <= 1e-5, res
    held = np.asarray(table.column("movie_id").to_pylist())[-500:]
    assert any(str(h) not in set(movies) for h in held)  # unseen movies among the checked rows
    (tmp_path / "movies.txt").unlink()  # the version reads its own copy
    with load(out) as s:
        assert s.spec.fields[2].vocabulary.source == str(out / "vocabulary" / "movie.txt")
        p = s.score({"user_id": int(users[0]), "gender": "M"}, [{"movie_id": int(movies[0])}, {"movie_id": -1}])
        assert p.shape == (2,) and s.stats()["vocabulary_unknown"] == 1  # the movie -1
