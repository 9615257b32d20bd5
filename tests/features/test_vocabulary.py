"""Vocabulary fields (``vocabulary: FILE``): values map to the file's rows 1..V, values it lacks to row 0, in
training and serving by the one FG; duplicate keys and a wrong ``rows`` are refused. Expected rows are the
line numbers of the files written here."""

import jsonschema_rs
import numpy as np
import pytest

from offgraph.features import FeatureGenerator, load_spec, parse_spec
from offgraph.features.spec import SpecError
from offgraph.features.spec_schema import spec_schema
from offgraph.features.vocabulary import VocabularyError, read_vocabulary, vocabulary_from_keys, write_vocabulary


def _spec(tmp_path, **movie):
    write_vocabulary(tmp_path / "movies.txt", ["m9", "m1", "42", "m7"])  # rows 1..4
    write_vocabulary(tmp_path / "genres.txt", ["drama", "comedy"])  # rows 1..2
    text = f"""
model: {{embedding_dim: 4, mlp: [8]}}
label: label
fields:
  - {{name: user, scope: request, op: id, input: user_id, rows: 100}}
  - {{name: movie, scope: item, op: id, input: movie_id, vocabulary: movies.txt{movie.get("extra", "")}}}
  - {{name: genre, scope: item, op: id, input: genres, separator: "|", vocabulary: genres.txt}}
  - {{name: user_x_genre, scope: cross, op: cross, inputs: [user, genre], rows: 50}}
"""
    (tmp_path / "spec.yaml").write_text(text)
    return load_spec(tmp_path / "spec.yaml")


def test_rows_are_line_numbers_unknown_is_row_zero(tmp_path):
    spec = _spec(tmp_path)
    movie, genre = spec.fields[1], spec.fields[2]
    assert (movie.rows, genre.rows) == (5, 3)  # V keys + the unknown row
    assert movie.vocabulary.rows_of(["m1", "m7", "m9", "42", "nope", "m10"]).tolist() == [2, 4, 1, 3, 0, 0]
    fg = FeatureGenerator(spec)
    cols = {"user_id": [1, 2, 3], "movie_id": [42, "m7", "m8"], "genres": ["comedy|drama", "war", None]}
    batch = fg.transform_columns(cols, 3, dense=False)
    m, g = batch.fields[1], batch.fields[2]
    assert m.ids.tolist() == [3, 4, 0] and m.offsets.tolist() == [0, 1, 2, 3]  # the int 42 is the key "42"
    assert g.ids.tolist() == [2, 1, 0] and g.offsets.tolist() == [0, 2, 3, 3]
    assert fg.vocabulary_unknown == {"movie": 1, "genre": 1}


def test_serving_gives_training_ids(tmp_path):
    spec = _spec(tmp_path)
    fg = FeatureGenerator(spec, item_cache_size=10)
    cands = [{"movie_id": "m1", "genres": "drama"}, {"movie_id": "zzz", "genres": "drama|comedy"}]
    served = fg.transform({"user_id": 7}, cands).per_row()
    trained = FeatureGenerator(spec).transform_columns(
        {"user_id": [7, 7], "movie_id": ["m1", "zzz"], "genres": ["drama", "drama|comedy"]}, 2, dense=False
    )
    for f in (1, 2, 3):
        assert served.fields[f].ids.tolist() == trained.fields[f].ids.tolist()
    assert served.fields[1].ids.tolist() == [2, 0]
    assert fg.vocabulary_unknown == {"movie": 1}


def test_duplicate_key_refused_naming_it(tmp_path):
    (tmp_path / "v.txt").write_text("a\nb\na\n")
    with pytest.raises(VocabularyError, match=r"duplicate key 'a' \(rows 1 and 3\)"):
        read_vocabulary(tmp_path / "v.txt")
    with pytest.raises(VocabularyError, match="key 2 is empty"):
        vocabulary_from_keys(["a", ""], "<keys>")
    write_vocabulary(tmp_path / "movies.txt", ["x", "y", "x"])
    raw = {
        "label": "l",
        "fields": [{"name": "movie", "scope": "item", "op": "id", "input": "m", "vocabulary": "movies.txt"}],
    }
    with pytest.raises(SpecError, match=r"field 'movie': vocabulary .*movies.txt: duplicate key 'x'"):
        parse_spec(raw, base=tmp_path)


def test_rows_must_be_vocabulary_size_plus_one(tmp_path):
    with pytest.raises(SpecError, match="rows 4 but its vocabulary .* has 4 keys: rows must be 5"):
        _spec(tmp_path, extra=", rows: 4")
    assert _spec(tmp_path, extra=", rows: 5").fields[1].rows == 5


def test_fingerprint_is_the_file_content_not_its_path(tmp_path):
    spec = _spec(tmp_path)
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "m.txt").write_bytes((tmp_path / "movies.txt").read_bytes())
    (tmp_path / "copy" / "g.txt").write_bytes((tmp_path / "genres.txt").read_bytes())
    moved = parse_spec(spec.with_vocabulary_paths({"movie": "m.txt", "genre": "g.txt"}), base=tmp_path / "copy")
    assert moved.fields[1].vocabulary.source == str(tmp_path / "copy" / "m.txt")
    assert moved.fingerprint() == spec.fingerprint()
    write_vocabulary(tmp_path / "copy" / "m.txt", ["m9", "m1", "42", "m8"])
    other = parse_spec(spec.with_vocabulary_paths({"movie": "m.txt", "genre": "g.txt"}), base=tmp_path / "copy")
    assert other.fingerprint() != spec.fingerprint()
    # re-parsed without a base (with_stats, a run's spec.yaml): the path was made absolute when first read
    assert parse_spec(spec.to_dict()).fields[1].vocabulary.sha256 == spec.fields[1].vocabulary.sha256


def test_schema_takes_vocabulary_without_rows(tmp_path):
    spec = _spec(tmp_path)
    validator = jsonschema_rs.validator_for(spec_schema())
    assert validator.is_valid(spec.to_dict())
    raw = spec.to_dict()
    del raw["fields"][0]["rows"]  # a hashed field still needs its rows
    assert not validator.is_valid(raw)


def test_lookup_is_exact_for_many_keys(tmp_path):
    keys = [f"k{i}" for i in range(20000)]
    vocab = vocabulary_from_keys(keys, "<keys>")
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 20000, 5000)
    probe = [keys[i] for i in idx] + [f"q{i}" for i in range(100)]
    expected = np.concatenate([idx + 1, np.zeros(100, np.int64)])
    assert np.array_equal(vocab.rows_of(probe), expected)


def test_capacity_rows_take_appended_keys_in_order(tmp_path):
    """``capacity: 3``: rows 5..7 after the 4 keys and the unknown row; a growing FG gives unknown values those rows,
    first seen first, until they run out; a serving FG told the keys maps them the same way."""
    spec = _spec(tmp_path, extra=", capacity: 3")
    movie = spec.fields[1]
    assert movie.rows == 8 and list(movie.appendable) == [5, 6, 7]
    trainer = FeatureGenerator(spec)
    trainer.grow(["movie"])
    cols = {"user_id": [1], "movie_id": ["new1"], "genres": [None]}
    assert trainer.transform_columns(cols, 1, dense=False, grow=False).fields[1].ids.tolist() == [0]  # a prediction
    assert not trainer.has_new_keys
    cols = {"user_id": [1] * 5, "movie_id": ["new1", "m1", "new2", "new1", "new3"], "genres": [None] * 5}
    assert trainer.transform_columns(cols, 5, dense=False).fields[1].ids.tolist() == [5, 2, 6, 5, 7]
    assert trainer.take_new_keys() == {"movie": (5, ["new1", "new2", "new3"])} and not trainer.has_new_keys
    cols = {"user_id": [1] * 2, "movie_id": ["new4", "new2"], "genres": [None] * 2}
    assert trainer.transform_columns(cols, 2, dense=False).fields[1].ids.tolist() == [0, 6]  # no row left
    assert trainer.take_new_keys() == {} and trainer.vocabulary_unknown["movie"] == 2  # the prediction's, new4

    server = FeatureGenerator(spec, item_cache_size=100)
    req = {"user_id": 1}
    before = server.transform(req, [{"movie_id": "new2", "genres": "drama"}]).fields[1].ids.tolist()
    state = server.item_cache_state()
    server.append_keys("movie", ["new1", "new2"])  # as the store's appends say
    assert before == [0] and server.transform(req, [{"movie_id": "new2", "genres": "drama"}]).fields[
        1
    ].ids.tolist() == [6]
    # the item cache goes to the next version's FG only where both map the same keys to the same rows
    assert FeatureGenerator(spec, item_cache_size=100).adopt_item_cache(state) == 1  # neither has appends
    assert FeatureGenerator(spec, item_cache_size=100).adopt_item_cache(server.item_cache_state()) == 0
    other = FeatureGenerator(spec, item_cache_size=100)
    other.append_keys("movie", ["new1", "new2"])
    assert other.adopt_item_cache(state) == 0  # held ids of new2: the unknown row, here row 6
    assert other.adopt_item_cache(server.item_cache_state()) == 1
    with pytest.raises(VocabularyError, match="only 1 of its capacity 3 rows are free"):
        other.append_keys("movie", ["a", "b"])
    with pytest.raises(ValueError, match=r"fields \['genre'\] have no vocabulary capacity"):
        other.grow(["genre"])


def test_appended_keys_index_grows_by_insertion_and_finds_every_key():
    """Appends in 200 chunks of random size: each key found at the row of its append order (a dict says which),
    values never appended unknown; a repeated key refused naming it and both rows."""
    from offgraph.features.vocabulary import AppendedKeys

    rng = np.random.default_rng(3)
    app = AppendedKeys("movie", 11, 5000)
    want: dict[str, int] = {}
    for _ in range(200):
        chunk = [f"id{int(x)}" for x in rng.choice(10**9, int(rng.integers(1, 20)), replace=False)]
        chunk = [k for k in chunk if k not in want]
        for k in chunk:
            want[k] = 11 + len(want)
        app.extend(chunk)
    probe = list(want)[::7] + ["never", "id-1"]
    ids = np.zeros(len(probe), np.int64)
    assert app.fill(probe, ids).tolist() == [len(probe) - 2, len(probe) - 1]
    assert ids.tolist() == [want.get(k, 0) for k in probe]
    some = list(want)[5]
    with pytest.raises(VocabularyError, match=f"key '{some}' is appended again"):
        app.extend(["fresh", some])
    with pytest.raises(VocabularyError, match=r"duplicate key 'q' \(rows \d+ and \d+\)"):
        app.extend(["q", "q"])
    assert app.keys == list(want)  # a refused append leaves nothing behind
