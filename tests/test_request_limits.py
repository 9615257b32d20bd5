"""Bounded work per request and per connection.

FG level: a field's ``max_values`` and the generator's ``max_request_values`` (serving only;
training takes every value). HTTP level (a real ``offgraph serve`` on 127.0.0.1, real httpx
clients and raw sockets): the bounds as 422s, a valid request's latency while maximal bodies
are scored, header / body / keep-alive timeouts, HTTP/0.9 request lines, the connection limit.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_helpers import copy_models, free_port, score, wait_ready

from features import FeatureGenerator, FeatureValueError, parse_spec
from features.spec import SpecError
from features.value_limits import TooManyValues

REPO = Path(__file__).resolve().parent.parent

# -- FG: values per field and per request --------------------------------------------------------
LIMITED = {
    "model": {"embedding_dim": 4, "hash": "xxh64", "mlp": [8]},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 1000},
        {"name": "query", "scope": "request", "op": "tokenize", "input": "query", "rows": 500, "max_values": 3},
        {"name": "title", "scope": "item", "op": "id", "input": "title_terms", "rows": 800, "max_values": 4},
        {"name": "tags", "scope": "item", "op": "id", "input": "tags", "separator": "|", "rows": 80,
         "max_values": 2},
        {"name": "cat", "scope": "item", "op": "id", "input": "cat_id", "rows": 100},
        {"name": "u_x_cat", "scope": "cross", "op": "cross", "inputs": ["user", "cat"], "rows": 5000},
    ],
}
SPEC = parse_spec(LIMITED)


def test_max_values_defaults_and_validation():
    spec = parse_spec({**LIMITED, "fields": LIMITED["fields"][:1]})
    assert spec.fields[0].params["max_values"] == 1000  # the documented default
    raw = {**LIMITED, "model": {**LIMITED["model"], "max_values": 7}}
    assert [f.params.get("max_values") for f in parse_spec(raw).fields] == [7, 3, 4, 2, 7, 64]
    for bad in (0, True, "5", 2.5):
        with pytest.raises(SpecError, match="field 'title': max_values must be an integer >= 1"):
            parse_spec({**LIMITED, "fields": [dict(LIMITED["fields"][2], max_values=bad)]})
    with pytest.raises(SpecError, match="model.max_values must be an integer >= 1"):
        parse_spec({**LIMITED, "model": {**LIMITED["model"], "max_values": 0}})
    bucket = {"name": "p", "scope": "item", "op": "bucketize", "input": "p", "boundaries": [1], "rows": 4,
              "max_values": 3}
    with pytest.raises(SpecError, match=r"field 'p': unknown parameter\(s\) \['max_values'\]"):
        parse_spec({**LIMITED, "fields": [bucket]})


def test_a_list_over_max_values_is_refused_naming_field_candidate_and_limit():
    fg = FeatureGenerator(SPEC)
    ok = [{"title_terms": ["a", "b", "c", "d"], "tags": "x|y", "cat_id": 1}]
    batch = fg.transform({"user_id": 1, "query": "red shoes now"}, ok)
    assert batch.fields[2].lengths.tolist() == [4]  # at the limit: every value, none cut
    cands = ok * 3 + [{"title_terms": ["a", "b", "c", "d", "e"]}]
    with pytest.raises(FeatureValueError, match=r"field 'title', candidates\[3\]: 5 values, more than the "
                                                r"field's max_values of 4"):
        fg.transform({"user_id": 1}, cands)
    with pytest.raises(FeatureValueError, match=r"field 'tags', candidates\[1\]: 3 values, more than the "
                                                r"field's max_values of 2"):
        fg.transform({"user_id": 1}, [{"tags": "x"}, {"tags": "x|y|z"}])  # a split string counts its terms
    with pytest.raises(FeatureValueError, match="field 'query', request: 4 values, more than the field's "
                                                "max_values of 3"):
        fg.transform({"user_id": 1, "query": "red running shoes now"}, ok)


def test_training_takes_every_value_of_a_long_list():
    fg = FeatureGenerator(SPEC)
    batch = fg.transform_columns({"user_id": [1], "title_terms": [list("abcdefgh")], "query": ["a b c d e"]}, 1)
    assert batch.fields[2].lengths.tolist() == [8] and batch.fields[1].lengths.tolist() == [5]


def test_errors_name_the_candidate_even_behind_the_item_cache():
    # the op sees only the cache misses: its row 0 here is candidate 2
    fg = FeatureGenerator(SPEC, item_cache_size=100)
    good = {"title_terms": ["a"], "cat_id": 1}
    fg.transform({"user_id": 1}, [good])
    with pytest.raises(FeatureValueError, match=r"field 'title', candidates\[2\]: nested value"):
        fg.transform({"user_id": 1}, [good, good, {"title_terms": [["nested"]]}])
    with pytest.raises(FeatureValueError, match=r"field 'title', candidates\[2\]: 5 values"):
        fg.transform({"user_id": 1}, [good, good, {"title_terms": list("abcde")}])


def test_max_request_values_counts_request_item_and_cross_values():
    # request: user 1 + query 2 = 3 values once; per candidate: title + tags + cat + the cross
    # (user x cat: one value when cat is set)
    request = {"user_id": 1, "query": "red shoes"}
    cands = [{"title_terms": ["a", "b"], "tags": "x|y", "cat_id": 1},  # 2 + 2 + 1 + 1 = 6
             {"title_terms": ["c"], "cat_id": 2}]                     # 1 + 0 + 1 + 1 = 3
    for cache in (0, 100):
        at_limit = FeatureGenerator(SPEC, item_cache_size=cache, max_request_values=12)
        over = FeatureGenerator(SPEC, item_cache_size=cache, max_request_values=11)
        for _ in range(2):  # the second time through the item cache (hits count too)
            assert at_limit.transform(request, cands).n == 2
            with pytest.raises(TooManyValues, match="more than 11 feature values .*max_request_values is 11"):
                over.transform(request, cands)
    with pytest.raises(ValueError, match="max_request_values must be an integer >= 1 or None"):
        FeatureGenerator(SPEC, max_request_values=0)


def test_max_request_values_refuses_long_lists_before_generating_them():
    fg = FeatureGenerator(SPEC, max_request_values=50)
    many = [{"title_terms": ["a", "b", "c", "d"]}] * 40  # 160 values, each row within max_values
    with pytest.raises(TooManyValues) as e:
        fg.transform({"user_id": 1}, many)
    assert e.value.counted == 1 + 160  # refused on the raw list lengths, before the op ran


# -- HTTP: a real `offgraph serve` with small limits ---------------------------------------------
HEADER_S = BODY_S = KEEP_ALIVE_S = 1.0
MAX_CONNECTIONS = 8
MAX_REQUEST_VALUES = 5000


class Served:
    """``offgraph serve`` in a subprocess, its output in a file (a pipe nobody reads could fill up)."""

    def __init__(self, models, tmp, *extra):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp / "serve.log"
        env = {k: v for k, v in os.environ.items() if k != "OFFGRAPH_ADMIN_TOKEN"}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "offgraph_cli", "serve", "--models", str(models), "--port", str(self.port),
                 "--cache-mb", "8", "--intra-threads", "1", "--inter-threads", "1", *extra],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_ready(self.url, 120, self.proc)
        except BaseException:
            self.stop()
            raise

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limited")
    srv = Served(copy_models(tiny_model[0], tmp / "models"), tmp, "--header-timeout", str(HEADER_S),
                 "--body-timeout", str(BODY_S), "--keep-alive-timeout", str(KEEP_ALIVE_S), "--max-connections",
                 str(MAX_CONNECTIONS), "--max-request-values", str(MAX_REQUEST_VALUES), "--score-threads", "2")
    yield srv
    srv.stop()


def _errors_500(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    found = re.search(r'^offgraph_http_errors_total\{code="500"\} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


def test_too_many_values_is_a_422_naming_field_candidate_and_limit(limited, requests_):
    req, cands = requests_[0]
    with httpx.Client(base_url=limited.url, timeout=30) as c:
        long_list = dict(cands[0], title_words=[f"w{i}" for i in range(1001)])  # the spec's default max_values
        r = score(c, {"request": req, "candidates": [cands[0], long_list]})
        assert r.status_code == 422, r.text
        assert "field 'title_words', candidates[1]: 1001 values, more than the field's max_values of 1000" \
            in r.json()["detail"]
        many = [dict(cands[0], movie_id=i, title_words=[f"w{i}_{j}" for j in range(20)]) for i in range(300)]
        r = score(c, {"request": req, "candidates": many})
        assert r.status_code == 422, r.text
        assert f"more than {MAX_REQUEST_VALUES} feature values" in r.json()["detail"]
        r = score(c, {"request": req, "candidates": cands})
        assert r.status_code == 200 and len(r.json()["scores"]) == len(cands)
    assert _errors_500(limited.url) == 0


def test_a_valid_request_stays_fast_while_maximal_bodies_are_scored(limited, requests_):
    # the body: 8 MiB, one candidate with 772,684 distinct title words (seconds of work unbounded)
    req, cands = requests_[1]
    words = [f"w{i}" for i in range(772_684)]
    big = json.dumps({"request": req, "candidates": [{"movie_id": 1, "genres": ["Action"], "title_words": words,
                                                       "release_year": 1990}]}).encode()
    assert len(big) <= 8 << 20
    stop, statuses = threading.Event(), []

    def flood():
        with httpx.Client(base_url=limited.url, timeout=120) as c:
            while not stop.is_set():
                statuses.append(score(c, big).status_code)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    latencies = []
    try:
        time.sleep(0.5)  # the four bodies are on their way
        with httpx.Client(base_url=limited.url, timeout=60) as c:
            for _ in range(10):
                t0 = time.perf_counter()
                r = score(c, {"request": req, "candidates": cands})
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert statuses and set(statuses) == {422}, statuses
    assert len(statuses) >= 4
    print("valid request latencies (s):", [round(x, 3) for x in latencies], "big bodies answered:", len(statuses))
    assert max(latencies) < 1.0, [round(x, 3) for x in latencies]
