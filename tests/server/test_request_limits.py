"""Bounded work per request and per connection.

FG level: a field's ``max_values`` and the generator's ``max_request_values`` (serving only;
training takes every value). HTTP level (a real ``offgraph serve`` on 127.0.0.1, real httpx
clients and raw sockets): the bounds as 422s, a valid request's latency while maximal bodies
are scored, header / body / keep-alive timeouts, HTTP/0.9 request lines, the connection limit.
"""

import json
import re
import socket
import threading
import time

import httpx
import pytest
from server_helpers import copy_models, score, serve_process, stop_server, wait_for, wait_ready

from offgraph.features import FeatureGenerator, FeatureValueError, parse_spec
from offgraph.features.spec import SpecError
from offgraph.features.value_limits import TooManyValues

# -- FG: values per field and per request --------------------------------------------------------
LIMITED = {
    "model": {"embedding_dim": 4, "hash": "xxh64", "mlp": [8]},
    "label": "label",
    "fields": [
        {"name": "user", "scope": "request", "op": "id", "input": "user_id", "rows": 1000},
        {"name": "query", "scope": "request", "op": "tokenize", "input": "query", "rows": 500, "max_values": 3},
        {"name": "title", "scope": "item", "op": "id", "input": "title_terms", "rows": 800, "max_values": 4},
        {"name": "tags", "scope": "item", "op": "id", "input": "tags", "separator": "|", "rows": 80, "max_values": 2},
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
    bucket = {
        "name": "p",
        "scope": "item",
        "op": "bucketize",
        "input": "p",
        "boundaries": [1],
        "rows": 4,
        "max_values": 3,
    }
    with pytest.raises(SpecError, match=r"field 'p': unknown parameter\(s\) \['max_values'\]"):
        parse_spec({**LIMITED, "fields": [bucket]})


def test_a_list_over_max_values_is_refused_naming_field_candidate_and_limit():
    fg = FeatureGenerator(SPEC)
    ok = [{"title_terms": ["a", "b", "c", "d"], "tags": "x|y", "cat_id": 1}]
    batch = fg.transform({"user_id": 1, "query": "red shoes now"}, ok)
    assert batch.fields[2].lengths.tolist() == [4]  # at the limit: every value, none cut
    cands = ok * 3 + [{"title_terms": ["a", "b", "c", "d", "e"]}]
    with pytest.raises(
        FeatureValueError,
        match=r"field 'title', candidates\[3\]: 5 values, more than the "
        r"field's max_values of 4",
    ):
        fg.transform({"user_id": 1}, cands)
    with pytest.raises(
        FeatureValueError,
        match=r"field 'tags', candidates\[1\]: 3 values, more than the "
        r"field's max_values of 2",
    ):
        fg.transform({"user_id": 1}, [{"tags": "x"}, {"tags": "x|y|z"}])  # a split string counts its terms
    with pytest.raises(
        FeatureValueError, match="field 'query', request: 4 values, more than the field's max_values of 3"
    ):
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
    cands = [
        {"title_terms": ["a", "b"], "tags": "x|y", "cat_id": 1},  # 2 + 2 + 1 + 1 = 6
        {"title_terms": ["c"], "cat_id": 2},
    ]  # 1 + 0 + 1 + 1 = 3
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
        self.log = tmp / "serve.log"
        flags = ["--cache-mb", "8", "--intra-threads", "1", "--inter-threads", "1", *extra]
        self.proc, self.url = serve_process(models, self.log, *flags, env={"OFFGRAPH_ADMIN_TOKEN": None})
        self.port = int(self.url.rsplit(":", 1)[1])
        try:
            wait_ready(self.url, 120, self.proc)
        except BaseException:
            self.stop()
            raise

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        stop_server(self.proc, 30)


@pytest.fixture(scope="module")
def limited(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limited")
    srv = Served(
        copy_models(tiny_model[0], tmp / "models"),
        tmp,
        "--header-timeout",
        str(HEADER_S),
        "--body-timeout",
        str(BODY_S),
        "--keep-alive-timeout",
        str(KEEP_ALIVE_S),
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--max-request-values",
        str(MAX_REQUEST_VALUES),
        "--score-threads",
        "2",
    )
    yield srv
    srv.stop()


def _errors_500(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r'^offgraph_http_errors_total\{code="500",.*\} (\S+)$', text, re.M))


def test_too_many_values_is_a_422_naming_field_candidate_and_limit(limited, requests_):
    req, cands = requests_[0]
    with httpx.Client(base_url=limited.url, timeout=30) as c:
        long_list = dict(cands[0], title_words=[f"w{i}" for i in range(1001)])  # the spec's default max_values
        r = score(c, {"request": req, "candidates": [cands[0], long_list]})
        assert r.status_code == 422, r.text
        assert (
            "field 'title_words', candidates[1]: 1001 values, more than the field's max_values of 1000"
            in r.json()["detail"]
        )
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
    big = json.dumps(
        {
            "request": req,
            "candidates": [{"movie_id": 1, "genres": ["Action"], "title_words": words, "release_year": 1990}],
        }
    ).encode()
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
        wait_for(lambda: statuses, 120, "the flood's first answer")  # the big bodies keep coming
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
    # each big body is refused: 422 (too many values), or 408 when a 2-core machine under load cannot
    # read 8 MiB within the body timeout; never scored (200) nor a 5xx
    assert statuses and set(statuses) <= {422, 408} and statuses.count(422) >= len(statuses) // 2, statuses
    assert len(statuses) >= 4
    print("valid request latencies (s):", [round(x, 3) for x in latencies], "big bodies answered:", len(statuses))
    # Unbounded, each big body would hold the scorer for seconds and every valid request would wait
    # behind them. The median bounds that; the worst one is given more room, as on a 2-core machine it
    # can meet the flood's four bodies arriving together (1.08 s seen once in CI, 0.46 s at most alone).
    ms = sorted(latencies)
    assert ms[len(ms) // 2] < 1.0 and ms[-1] < 3.0, [round(x, 3) for x in latencies]


def _connect(url_port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", url_port), timeout=10)
    s.settimeout(10)  # every read below is bounded
    return s


def _read_until_closed(s: socket.socket) -> tuple[float, bytes]:
    """(seconds until the server closed the connection, what it sent)."""
    t0, data = time.monotonic(), b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        pass
    return time.monotonic() - t0, data


@pytest.mark.parametrize(
    "sent, answer",
    [
        (b"", b""),  # idle: closed, nothing said
        (b"GET /heal", b"HTTP/1.1 408 "),  # half a request line
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\nAccept: */", b"HTTP/1.1 408 "),  # half the headers
    ],
)
def test_a_head_not_sent_in_time_is_closed_within_the_header_timeout(limited, sent, answer):
    with _connect(limited.port) as s:
        s.sendall(sent)
        seconds, data = _read_until_closed(s)
    assert HEADER_S * 0.8 < seconds < HEADER_S + 2, seconds
    assert data.startswith(answer) and (answer or not data), data
    if answer:
        assert b"request head not complete within 1 s" in data


def test_a_half_sent_body_is_a_408_within_the_body_timeout(limited):
    with _connect(limited.port) as s:
        s.sendall(
            b"POST /v1/models/ml:score HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 1000\r\n\r\n{"request": {'
        )
        seconds, data = _read_until_closed(s)
    assert BODY_S * 0.8 < seconds < BODY_S + 2, seconds
    assert data.startswith(b"HTTP/1.1 408 ") and b"request body not received within 1 s" in data, data
    # a body no route reads (404 at once) is not held open either
    with _connect(limited.port) as s:
        s.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\ncontent-length: 1000\r\n\r\n{")
        seconds, data = _read_until_closed(s)
    assert seconds < BODY_S + 3 and data.startswith(b"HTTP/1.1 404 "), (seconds, data)


def test_an_http09_request_line_gets_a_400_at_once(limited):
    for line in (b"GET /\r\n", b"GET /healthz\n", b"GET /\r\n\r\n"):
        with _connect(limited.port) as s:
            s.sendall(line)
            seconds, data = _read_until_closed(s)
        assert seconds < 0.5 * HEADER_S, (line, seconds)
        assert data.startswith(b"HTTP/1.1 400 ") and b"HTTP/0.9" in data, (line, data)


def test_keep_alive_idle_close_and_a_request_line_split_over_packets(limited):
    with _connect(limited.port) as s:
        for part in (b"GET /hea", b"lthz HTTP/1.1\r\nHo", b"st: x\r\n\r\n"):  # slow but within the timeout
            s.sendall(part)
            time.sleep(0.1)
        seconds, data = _read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 200 ") and data.endswith(b'{"status":"ok"}'), data
    assert KEEP_ALIVE_S * 0.8 < seconds < KEEP_ALIVE_S + 2, seconds


def test_oversized_head_is_a_431(limited):
    with _connect(limited.port) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(40):
                s.sendall(b"X-Filler: " + b"a" * 4000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        seconds, data = _read_until_closed(s)
    assert data.startswith(b"HTTP/1.1 431 "), data


def test_many_idle_connections_do_not_lock_out_a_client(limited):
    idle = [_connect(limited.port) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)
        t0 = time.monotonic()
        r = httpx.get(limited.url + "/healthz", timeout=5)
        assert r.status_code == 200 and time.monotonic() - t0 < 0.5 * HEADER_S
    finally:
        for s in idle:
            s.close()


def test_connections_busy_with_bodies_get_a_503_then_are_freed(limited):
    busy = []
    try:
        for _ in range(MAX_CONNECTIONS):
            s = _connect(limited.port)
            s.sendall(b"POST /v1/models/ml:score HTTP/1.1\r\nHost: x\r\ncontent-length: 1000\r\n\r\n{")
            busy.append(s)
        time.sleep(0.2)
        r = httpx.get(limited.url + "/healthz", timeout=5)
        assert r.status_code == 503, r.text
        wait_for(lambda: _status(limited.url + "/healthz") == 200, BODY_S + 5, "the busy connections to time out")
    finally:
        for s in busy:
            s.close()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.TransportError:
        return 0


def test_a_client_leaving_mid_body_is_not_a_server_error(limited):
    before = _errors_500(limited.url)
    for _ in range(3):
        with _connect(limited.port) as s:
            s.sendall(b'POST /v1/models/ml:score HTTP/1.1\r\nHost: x\r\ncontent-length: 1000\r\n\r\n{"req')
            time.sleep(0.1)
    time.sleep(0.3)
    assert _errors_500(limited.url) == before == 0
    assert "Traceback" not in limited.output() and "internal error" not in limited.output()


def test_workers_get_the_same_limits(tiny_model, requests_, tmp_path):
    # --workers N builds its uvicorn servers itself (offgraph.server.process.workers): the same options must reach them
    srv = Served(
        copy_models(tiny_model[0], tmp_path / "models"),
        tmp_path,
        "--workers",
        "2",
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--max-request-values",
        "50",
    )
    try:
        for _ in range(4):  # fresh connections: the kernel spreads them over both workers
            with _connect(srv.port) as s:
                seconds, data = _read_until_closed(s)
            assert 0.8 < seconds < 3 and data == b"", seconds
            with _connect(srv.port) as s:
                s.sendall(b"GET /\r\n")
                seconds, data = _read_until_closed(s)
            assert seconds < 0.5 and data.startswith(b"HTTP/1.1 400 "), data
            with _connect(srv.port) as s:
                s.sendall(b"POST /v1/models/ml:score HTTP/1.1\r\nHost: x\r\ncontent-length: 100\r\n\r\n{")
                seconds, data = _read_until_closed(s)
            assert 0.8 < seconds < 3 and data.startswith(b"HTTP/1.1 408 "), data
        req, cands = requests_[0]
        r = httpx.post(srv.url + "/v1/models/ml:score", json={"request": req, "candidates": cands * 10}, timeout=30)
        assert r.status_code == 422 and "more than 50 feature values" in r.json()["detail"], r.text
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"header_timeout_s": 0}, "header_timeout_s (--header-timeout) must be greater than 0, got 0"),
        ({"header_timeout_s": 86400}, "header_timeout_s (--header-timeout) must be less than 86400"),
        ({"body_timeout_s": float("nan")}, "body_timeout_s (--body-timeout) must be a finite number"),
        ({"keep_alive_timeout_s": "5"}, "keep_alive_timeout_s (--keep-alive-timeout) must be a valid number, got '5'"),
        ({"keep_alive_timeout_s": True}, "keep_alive_timeout_s (--keep-alive-timeout) must be a valid number"),
        ({"max_connections": 0}, "max_connections (--max-connections) must be greater than or equal to 1"),
        ({"max_connections": 2.5}, "max_connections (--max-connections) must be a valid integer, got 2.5"),
        ({"max_connection": 5}, "HttpLimits: unknown setting 'max_connection'"),
    ],
)
def test_http_limits_are_validated_naming_the_option(kw, words):
    from offgraph.server.config import HttpLimits

    with pytest.raises(ValueError, match=re.escape(words)):
        HttpLimits(**kw)
