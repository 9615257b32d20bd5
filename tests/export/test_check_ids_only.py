"""`offgraph check --ids-only` on the tiny real model with real RocksDB feature tables that lack some keys: the
summary and the JSON count the candidates whose item key is unknown and, apart, the requests whose request-scope
key (the user) is unknown."""

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
from server_helpers import copy_models

from offgraph.feature_tables.build import build_feature_tables
from offgraph.scoring.scorer import Scorer

CHECKED = 1500


def test_check_ids_only_counts_unknown_request_keys_apart_from_unknown_candidates(tiny_model, tmp_path, capsys):
    import offgraph.cli

    pristine, table = tiny_model
    models = copy_models(pristine, tmp_path / "models")
    with Scorer(models / "ml" / "1", verify=False) as s:
        spec = s.spec
    checked = table.slice(0, CHECKED)
    # the tables are loaded from rows that leave out every 3rd user and every 7th movie of the checked rows
    users = np.unique(checked.column("user_id").to_numpy())
    movies = np.unique(checked.column("movie_id").to_numpy())
    dropped = pc.or_(
        pc.is_in(table.column("user_id"), value_set=pc.cast(users[::3], table.column("user_id").type)),
        pc.is_in(table.column("movie_id"), value_set=pc.cast(movies[::7], table.column("movie_id").type)),
    )
    loaded = table.filter(pc.invert(dropped))
    build_feature_tables(models / "ml", spec, loaded, progress=False)
    known_users = set(loaded.column("user_id").to_pylist())
    known_movies = set(loaded.column("movie_id").to_pylist())
    # what the check must report, from the data alone: one request per user (its features do not change)
    want_requests = len(set(checked.column("user_id").to_pylist()) - known_users)
    want_candidates = sum(m not in known_movies for m in checked.column("movie_id").to_pylist())
    assert want_requests >= 3 and want_candidates > 5

    data = tmp_path / "rows.parquet"
    pq.write_table(checked, data)
    out = tmp_path / "check.json"
    rc = offgraph.cli.main(
        [
            "check",
            "--model",
            str(models / "ml" / "1"),
            "--run",
            str(pristine.parent / "run"),
            "--data",
            str(data),
            "--rows",
            "all",
            "--limit",
            "0",
            "--ids-only",
            "--json",
            str(out),
        ]
    )
    assert rc == 1  # unknown keys score differently ids-only
    res = json.loads(out.read_text())
    assert res["ids_only_unknown_requests"] == want_requests, res
    assert res["ids_only_unknown_candidates"] == want_candidates, res
    printed = capsys.readouterr().out
    assert f"{want_candidates} candidates with an unknown item key" in printed, printed
    assert f"{want_requests} requests with an unknown request key" in printed, printed
