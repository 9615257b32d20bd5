"""`offgraph experiment report` (``offgraph.experiments.report``): served logs written by the served log's own
writer and outcome logs, the report's CTR, UCTR, mean gain and NDCG per arm against values worked out by hand on
a tiny log and against a plain per-record computation on a generated one, its cluster-bootstrap intervals against
the delta method's, and bad input refused in one line, exit 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from offgraph.cli import main
from offgraph.experiments.report import ReportError, experiment_report, json_field
from offgraph.server.process.served_log import ServedLog
from offgraph.server.process.served_log_spool import SpoolSink, read_served


def write_served(directory, records: list[tuple]) -> None:
    """``records``: (request_id, arm, version, request, candidates, scores), logged as the server logs them (the
    served log at rate 1 into its spool sink: the order by descending score), in batches of half the records."""
    log = ServedLog(SpoolSink(directory), 1.0, batch_rows=max(1, len(records) // 2), flush_s=60.0)
    for rid, arm, version, req, cands, scores in records:
        assert log.offer(rid, "ml", version, arm, req, cands, np.asarray(scores, np.float32))
    log.close()
    assert log.written == len(records) and log.dropped == 0


def prior_scores(n: int) -> list[float]:
    """The prior arm's scores: the order sent."""
    return [(n - i) / n for i in range(n)]


def items(*ids: int) -> list[dict]:
    return [{"movie_id": i, "genres": ["Drama"]} for i in ids]


# the tiny log: arm prior (users 1 and 2), arm v1 (users 3 and 4, and one request without a user)
TINY = [
    ("r1", "prior", None, {"user_id": 1, "age": 30}, items(10, 11, 12), prior_scores(3)),
    ("r2", "prior", None, {"user_id": 1, "age": 30}, items(13, 14), prior_scores(2)),
    ("r3", "prior", None, {"user_id": 2}, items(10, 15), prior_scores(2)),
    ("r4", "v1", 1, {"user_id": 3}, items(10, 11, 12), [0.5, 0.1, 0.9]),  # served 12, 10, 11
    ("r5", "v1", 1, {"user_id": 4}, items(16), [0.3]),
    ("r6", "v1", 1, {"age": 20}, items(10, 11), [0.2, 0.7]),  # served 11, 10
]
TINY_OUTCOMES = [
    ("r1", 11, "click", None),
    ("r1", 11, "play_share", 0.5),
    ("r1", 12, "play_share", 1.0),  # played without a click event: gain, no click
    ("r3", 15, "click", None),
    ("r3", 15, "play_share", 0.25),
    ("r4", 12, "click", None),
    ("r4", 12, "click", None),  # twice: one clicked candidate
    ("r4", 12, "play_share", 1.0),
    ("r4", 10, "click", None),
    ("r4", 10, "play_share", 0.5),
    ("r4", 11, "play", None),  # a play is neither a click nor (with play_share the gain) a gain
    ("r6", 10, "click", None),
    ("r6", 10, "play_share", 0.2),
    ("zz", 10, "click", None),  # a request not in the log
    ("r2", 99, "click", None),  # an item not among r2's candidates
]


def outcome_table(rows) -> pa.Table:
    rid, item, event, value = zip(*rows)
    return pa.table(
        {
            "request_id": list(rid),
            "movie_id": pa.array(item, pa.int64()),
            "event": list(event),
            "value": pa.array(value, pa.float64()),
        }
    )


@pytest.fixture
def tiny(tmp_path):
    write_served(tmp_path / "served", TINY)
    pq.write_table(outcome_table(TINY_OUTCOMES), tmp_path / "outcomes.parquet")
    return tmp_path


def test_tiny_log_figures_worked_out_by_hand(tiny):
    rep = experiment_report(
        read_served(tiny / "served"), pq.read_table(tiny / "outcomes.parquet"), item_field="movie_id", control="prior"
    )
    prior, v1 = rep["arms"]["prior"], rep["arms"]["v1"]
    assert (prior["requests"], prior["users"], prior["candidates"], prior["clicks"]) == (3, 2, 7, 2)
    assert (v1["requests"], v1["users"], v1["requests_without_user"], v1["candidates"], v1["clicks"]) == (3, 2, 1, 6, 3)
    # pairs: (r1, 11), (r1, 12), (r3, 15), (r4, 12), (r4, 10), (r4, 11), (r6, 10) served; (zz, 10), (r2, 99) not
    assert rep["outcomes"] == {"rows": 15, "pairs": 9, "matched": 7, "unmatched": 2}
    l3 = math.log2(3)
    # prior: r1 served 10, 11, 12 with gains 0, .5, 1: DCG .5/log2 3 + 1/log2 4; ideal 1 + .5/log2 3.
    # r3 served 10, 15 with gains 0, .25: DCG .25/log2 3, ideal .25. r2: no gain, not judged
    ndcg_prior = ((0.5 / l3 + 0.5) / (1 + 0.5 / l3) + 1 / l3) / 2
    # v1: r4 served 12, 10, 11 with gains 1, .5, 0: the ideal order, 1; r6 served 11, 10 with gains 0, .2
    ndcg_v1 = (1.0 + 1 / l3) / 2
    expected = {
        "prior": {"ctr": 2 / 7, "uctr": 1.0, "mean_gain": 1.75 / 7, "ndcg": ndcg_prior},
        "v1": {"ctr": 3 / 6, "uctr": 1 / 2, "mean_gain": 1.7 / 6, "ndcg": ndcg_v1},  # user 4 never clicked
    }
    for arm, figures in expected.items():
        for metric, value in figures.items():
            got = rep["arms"][arm][metric]
            assert got["value"] == pytest.approx(value, abs=1e-12), (arm, metric)
            assert got["lo"] <= got["value"] + 1e-12 and got["value"] <= got["hi"] + 1e-12, (arm, metric, got)
    for metric in expected["v1"]:
        diff = rep["vs_control"]["v1"][metric]["diff"]
        assert diff == pytest.approx(expected["v1"][metric] - expected["prior"][metric], abs=1e-12)
    assert list(rep["vs_control"]) == ["v1"]
    # NDCG@1: r1's top candidate has no gain (0), r3's neither (0); r4's has the top gain (1), r6's not (0)
    at1 = experiment_report(
        read_served(tiny / "served"), pq.read_table(tiny / "outcomes.parquet"), item_field="movie_id", k=1, draws=50
    )
    assert at1["arms"]["prior"]["ndcg"]["value"] == 0.0 and at1["arms"]["v1"]["ndcg"]["value"] == 0.5
    # gain from the clicks alone: prior's clicked items 11 (r1) and 15 (r3), v1's 12 and 10 (r4), 10 (r6)
    clicks = experiment_report(
        read_served(tiny / "served"),
        pq.read_table(tiny / "outcomes.parquet"),
        item_field="movie_id",
        gain_event="click",
    )
    assert clicks["arms"]["prior"]["mean_gain"]["value"] == pytest.approx(2 / 7)
    assert clicks["arms"]["v1"]["ndcg"]["value"] == pytest.approx((1.0 + 1 / l3) / 2)  # r4 ideal, r6 10 second


def test_cli_prints_writes_json_and_png(tiny, capsys):
    out = tiny / "report.json"
    png = tiny / "report.png"
    csv = tiny / "outcomes.csv"
    pcsv.write_csv(outcome_table(TINY_OUTCOMES), csv)
    rc = main(
        [
            "experiment",
            "report",
            "--served",
            str(tiny / "served"),
            "--outcomes",
            str(csv),
            "--item-field",
            "movie_id",
            "--control",
            "prior",
            "--json",
            str(out),
            "--png",
            str(png),
            "--draws",
            "200",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0, text
    lines = text.splitlines()
    assert any(line.startswith("prior (control)") and "0.2857 [" in line for line in lines), text
    assert any(line.startswith("v1 - prior") and "+0.2143 [" in line for line in lines), text  # 3/6 - 2/7
    saved = json.loads(out.read_text())
    assert saved["arms"]["v1"]["ctr"]["value"] == pytest.approx(0.5) and saved["draws"] == 200
    assert saved["arms"]["prior"]["uctr"]["value"] == 1.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def generated_logs(seed: int, users: int = 600):
    """A served log of three arms with users of different click propensities (so a user's requests are
    correlated) and its outcome log."""
    rng = np.random.default_rng(seed)
    records, outcomes = [], []
    arms = ["prior", "pointwise", "listwise"]
    propensity = rng.beta(1, 4, users)
    for u in range(users):
        arm = arms[u % 3]
        for r in range(int(rng.integers(1, 5))):
            rid = f"u{u}-r{r}"
            ids = rng.choice(500, int(rng.integers(1, 12)), replace=False)
            scores = prior_scores(len(ids)) if arm == "prior" else rng.random(len(ids)).tolist()
            records.append(
                (rid, arm, None if arm == "prior" else 1 + arms.index(arm), {"user_id": u}, items(*ids), scores)
            )
            for i in ids:
                if rng.random() < propensity[u] * (1.3 if arm == "listwise" else 1.0):
                    outcomes.append((rid, int(i), "click", None))
                    outcomes.append((rid, int(i), "play_share", float(rng.random())))
    return records, outcome_table(outcomes)


def plain_figures(records, outcomes: pa.Table, k: int) -> dict:
    """CTR, UCTR, mean gain and NDCG@k per arm, one record at a time with Python's own sums."""
    clicked, gains = set(), {}
    for row in outcomes.to_pylist():
        key = (row["request_id"], row["movie_id"])
        if row["event"] == "click":
            clicked.add(key)
        elif row["event"] == "play_share":
            gains[key] = gains.get(key, 0.0) + row["value"]
    out: dict = {}
    for rid, arm, _, req, cands, scores in records:
        a = out.setdefault(arm, {"n": 0, "clicks": 0, "gain": 0.0, "ndcg": [], "users": {}})
        order = sorted(range(len(cands)), key=lambda i: -np.float32(scores[i]))  # sorted() is stable
        g = [gains.get((rid, cands[i]["movie_id"]), 0.0) for i in order]
        c = sum((rid, x["movie_id"]) in clicked for x in cands)
        a["n"] += len(cands)
        a["clicks"] += c
        a["gain"] += sum(g)
        a["users"][req["user_id"]] = a["users"].get(req["user_id"], 0) + c
        ideal = sorted(g, reverse=True)
        idcg = sum(x / math.log2(i + 2) for i, x in enumerate(ideal[:k]))
        if idcg > 0:
            a["ndcg"].append(sum(x / math.log2(i + 2) for i, x in enumerate(g[:k])) / idcg)
    return {
        arm: {
            "ctr": a["clicks"] / a["n"],
            "uctr": sum(c > 0 for c in a["users"].values()) / len(a["users"]),
            "mean_gain": a["gain"] / a["n"],
            "ndcg": sum(a["ndcg"]) / len(a["ndcg"]),
            "users": len(a["users"]),
        }
        for arm, a in out.items()
    }


@pytest.mark.parametrize("k", [3, 10])
def test_generated_log_matches_a_plain_computation(tmp_path, k):
    records, outcomes = generated_logs(seed=k)
    write_served(tmp_path / "served", records)
    rep = experiment_report(read_served(tmp_path / "served"), outcomes, item_field="movie_id", k=k, draws=100)
    plain = plain_figures(records, outcomes, k)
    assert set(rep["arms"]) == set(plain) == {"prior", "pointwise", "listwise"}
    for arm, figures in plain.items():
        assert rep["arms"][arm]["users"] == figures["users"]
        for metric in ("ctr", "uctr", "mean_gain", "ndcg"):
            assert rep["arms"][arm][metric]["value"] == pytest.approx(figures[metric], rel=1e-12), (arm, metric)
    # the default control: the arm with the most requests
    counts = {arm: sum(r[1] == arm for r in records) for arm in plain}
    assert rep["control"] == max(sorted(counts), key=lambda a: counts[a])


def test_intervals_are_a_cluster_bootstrap_over_users(tmp_path):
    """CTR's interval against the delta method's for a ratio of per-user sums (an independent formula for the
    same cluster-level uncertainty); a user's clicks are correlated, so an interval that resampled candidates
    one by one would be much narrower. Seeded: the same draws give the same interval."""
    records, outcomes = generated_logs(seed=7, users=1500)
    write_served(tmp_path / "served", records)
    served = read_served(tmp_path / "served")
    rep = experiment_report(served, outcomes, item_field="movie_id", control="prior", draws=2000, seed=3)
    clicked = {(r["request_id"], r["movie_id"]) for r in outcomes.to_pylist() if r["event"] == "click"}
    per_user: dict = {}
    for rid, arm, _, req, cands, _ in records:
        n, c = per_user.get((arm, req["user_id"]), (0, 0))
        per_user[(arm, req["user_id"])] = (n + len(cands), c + sum((rid, x["movie_id"]) in clicked for x in cands))
    se = {}
    for arm in ("prior", "pointwise", "listwise"):
        n, c = np.array([v for (a, _), v in per_user.items() if a == arm], dtype=np.float64).T
        ratio = c.sum() / n.sum()
        se[arm] = math.sqrt(((c - ratio * n) ** 2).sum()) / n.sum()
        ci = rep["arms"][arm]["ctr"]
        assert (ci["hi"] - ci["lo"]) / 2 == pytest.approx(1.96 * se[arm], rel=0.15), (arm, ci, se[arm])
        # the candidates as independent trials: a much narrower interval than the users' clustering gives
        assert 1.96 * math.sqrt(ratio * (1 - ratio) / n.sum()) < 0.8 * (ci["hi"] - ci["lo"]) / 2
    d = rep["vs_control"]["listwise"]["ctr"]
    diff_se = math.hypot(se["listwise"], se["prior"])
    assert (d["hi"] - d["lo"]) / 2 == pytest.approx(1.96 * diff_se, rel=0.15), (d, diff_se)
    again = experiment_report(served, outcomes, item_field="movie_id", control="prior", draws=2000, seed=3)
    assert again == rep
    other = experiment_report(served, outcomes, item_field="movie_id", control="prior", draws=2000, seed=4)
    assert other["arms"]["prior"]["ctr"]["lo"] != rep["arms"]["prior"]["ctr"]["lo"]


def _report(tiny, *extra: str) -> list[str]:
    return ["experiment", "report", "--served", str(tiny / "served"), "--item-field", "movie_id", *extra]


@pytest.mark.parametrize(
    "case, message",
    [
        ("no event column", "the outcome log lacks the column(s) event"),
        ("no item column", "the outcome log lacks the column(s) movie_id"),
        ("unknown control", "the control arm 'v9' is not in the served log (its arms: prior, v1)"),
        ("empty served log", "the served log has no records"),
        ("empty outcome log", "the outcome log has no rows"),
        ("unknown event", "the outcome log's events are click, play, play_share; it has ['like']"),
        ("no outcome served", "none of the outcome log's 1 (request_id, movie_id) pairs is a served candidate"),
        ("no item field", "no served candidate has the field 'film' (the item key; see --item-field)"),
        ("no served dir", "no such served-log directory"),
        ("no outcome file", "no such outcome log"),
        ("no item field given", "which field is the item: --item-field, or --models"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny, capsys, case, message):
    good = outcome_table(TINY_OUTCOMES)
    path = tiny / "o.parquet"
    args = _report(tiny, "--outcomes", str(path))
    if case == "no event column":
        pq.write_table(good.drop_columns(["event"]), path)
    elif case == "no item column":
        pq.write_table(good.drop_columns(["movie_id"]), path)
    elif case == "unknown control":
        pq.write_table(good, path)
        args += ["--control", "v9"]
    elif case == "empty served log":
        pq.write_table(good, path)
        (tiny / "empty").mkdir()
        args[3] = str(tiny / "empty")
    elif case == "empty outcome log":
        pq.write_table(good.slice(0, 0), path)
    elif case == "unknown event":
        pq.write_table(outcome_table([("r1", 10, "like", None)]), path)
    elif case == "no outcome served":
        pq.write_table(outcome_table([("zz", 10, "click", None)]), path)
    elif case == "no item field":
        pq.write_table(good.rename_columns(["request_id", "film", "event", "value"]), path)
        args[5] = "film"
    elif case == "no served dir":
        pq.write_table(good, path)
        args[3] = str(tiny / "nowhere")
    elif case == "no outcome file":
        pass
    elif case == "no item field given":
        pq.write_table(good, path)
        args = ["experiment", "report", "--served", str(tiny / "served"), "--outcomes", str(path)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("offgraph experiment: error: "), err
    assert message in err, err


def test_library_refuses_what_it_cannot_read(tiny):
    served = read_served(tiny / "served")
    outcomes = outcome_table(TINY_OUTCOMES)
    with pytest.raises(ReportError, match="lacks the column"):
        experiment_report(served.drop_columns(["order"]), outcomes, item_field="movie_id")
    with pytest.raises(ReportError, match="play_share needs one"):
        experiment_report(served, outcomes.drop_columns(["value"]), item_field="movie_id")
    with pytest.raises(ReportError, match="no record of the model 'other'"):
        experiment_report(served, outcomes, item_field="movie_id", model="other")
    # clicks alone (no value column) are a log the report reads, with the clicks as the gain
    rep = experiment_report(served, outcomes.drop_columns(["value"]), item_field="movie_id", gain_event="click")
    assert rep["arms"]["v1"]["ctr"]["value"] == 0.5


def test_item_field_from_the_model_spec(tiny, tiny_model, capsys):
    """Without --item-field the item is the item_key of the spec the logged version was trained with
    (examples/movielens.yaml's, movie_id); a models directory without the logged version is refused, naming it."""
    models = tiny_model[0]
    pq.write_table(outcome_table(TINY_OUTCOMES), tiny / "o.parquet")
    args = ["experiment", "report", "--served", str(tiny / "served"), "--outcomes", str(tiny / "o.parquet")]
    assert main([*args, "--models", str(models), "--json", str(tiny / "r.json"), "--draws", "20"]) == 0
    capsys.readouterr()
    saved = json.loads((tiny / "r.json").read_text())
    assert saved["item_field"] == "movie_id" and saved["arms"]["v1"]["ctr"]["value"] == 0.5
    (tiny / "no-models").mkdir()
    assert main([*args, "--models", str(tiny / "no-models")]) == 2
    assert "no-models/ml/1: no manifest.json" in capsys.readouterr().err


def test_json_field_reads_objects_as_sent():
    """The served log keeps a JSON body's candidates as the caller sent their bytes: spaces, newlines inside an
    object, keys in any order; a number is its digits, a missing or null key null."""
    texts = pa.array(
        ['{\n  "genres": ["a"],\n  "movie_id": 5\n}', '{"t": "x\\ny", "movie_id": 70}', "{}", '{"movie_id": null}']
    )
    assert json_field(texts, "movie_id").to_pylist() == ["5", "70", None, None]
    assert json_field(pa.array(['{"u": "196"}', '{"u": "a b"}']), "u").to_pylist() == ["196", "a b"]
    with pytest.raises(ReportError, match="not one scalar type"):
        json_field(pa.array(['{"u": 1}', '{"u": "x"}']), "u")
