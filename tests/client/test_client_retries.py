"""The client's retries against a real loopback HTTP server that answers from a script: a 503 with
Retry-After is retried and then succeeds, or gives ``Unavailable`` once the attempts or the total time
run out; Retry-After is honoured; admin calls are not retried; connection failures are retried for
reads only. The sync and the async client alike."""

import asyncio
import time

import pytest
from scripted_server import OK_SCORE, SCORE_BODY, UNAVAILABLE, ScriptedServer, unavailable

from offgraph.client import AsyncClient, Client, ConnectionFailed, Retries, ScoreResult, Unavailable
from offgraph.testing.harness import free_port

FAST = Retries(attempts=4, total_seconds=20, backoff_seconds=0.01, max_backoff_seconds=0.05)
REQ, CANDS = {"user_id": 1}, [{"movie_id": 1}, {"movie_id": 2}]


def test_a_503_with_retry_after_is_retried_then_succeeds():
    with ScriptedServer([unavailable("0"), unavailable("0"), OK_SCORE]) as srv, Client(srv.url, retries=FAST) as c:
        got = c.score("ml", REQ, CANDS)
    assert got == ScoreResult(**SCORE_BODY)
    assert [(m, p) for _, m, p in srv.seen] == [("POST", "/v1/models/ml:score")] * 3


def test_a_503_that_lasts_gives_unavailable_after_the_attempts():
    with ScriptedServer([unavailable("0")]) as srv, Client(srv.url, retries=FAST) as c:
        with pytest.raises(Unavailable) as e:
            c.score("ml", REQ, CANDS)
    assert len(srv.seen) == FAST.attempts
    err = e.value
    assert (err.status, err.message, err.body, err.attempts) == (503, UNAVAILABLE["detail"], UNAVAILABLE, 4)
    assert err.retry_after == 0 and "after 4 attempts" in str(err)


def test_retry_after_is_waited_for():
    with ScriptedServer([unavailable("1"), OK_SCORE]) as srv, Client(srv.url, retries=FAST) as c:
        assert c.score("ml", REQ, CANDS).scores == SCORE_BODY["scores"]
    (t0, *_), (t1, *_) = srv.seen
    assert t1 - t0 >= 1.0


def test_no_retry_whose_wait_would_end_past_the_total_time():
    retries = Retries(attempts=10, total_seconds=1.0)
    with ScriptedServer([unavailable("30"), OK_SCORE]) as srv, Client(srv.url, retries=retries) as c:
        t0 = time.monotonic()
        with pytest.raises(Unavailable) as e:
            c.score("ml", REQ, CANDS)
        assert time.monotonic() - t0 < 1.0  # gave up at once rather than waiting 30 s
    assert len(srv.seen) == 1 and e.value.retry_after == 30


def test_a_503_without_retry_after_is_retried_with_backoff():
    with ScriptedServer([unavailable(None), OK_SCORE]) as srv, Client(srv.url, retries=FAST) as c:
        assert c.score("ml", REQ, CANDS).version == 3
    assert len(srv.seen) == 2


def test_admin_calls_are_not_retried():
    with ScriptedServer([unavailable("0"), OK_SCORE]) as srv, Client(srv.url, retries=FAST, admin_token="t") as c:
        with pytest.raises(Unavailable) as e:
            c.rollback("ml")
    assert len(srv.seen) == 1 and e.value.attempts == 1


def test_connection_failures_are_retried_for_reads_only():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with Client(url, retries=FAST) as c:
        with pytest.raises(ConnectionFailed) as read:
            c.models()
        with pytest.raises(ConnectionFailed) as score:
            c.score("ml", REQ, CANDS)
        assert not c.healthy()
    assert read.value.attempts == FAST.attempts and read.value.status is None
    assert score.value.attempts == 1 and "POST" in score.value.message and url in score.value.message


def test_async_client_retries_then_succeeds_or_gives_unavailable():
    async def run(url: str):
        async with AsyncClient(url, retries=FAST) as c:
            return await c.score("ml", REQ, CANDS)

    with ScriptedServer([unavailable("0"), unavailable("0"), OK_SCORE]) as srv:
        assert asyncio.run(run(srv.url)) == ScoreResult(**SCORE_BODY)
        assert len(srv.seen) == 3
    with ScriptedServer([unavailable("0")]) as srv:
        with pytest.raises(Unavailable) as e:
            asyncio.run(run(srv.url))
    assert len(srv.seen) == FAST.attempts and e.value.attempts == FAST.attempts


def test_retries_bounds_are_checked():
    with pytest.raises(ValueError, match="attempts"):
        Retries(attempts=0)
    with pytest.raises(ValueError, match="total_seconds"):
        Retries(total_seconds=float("nan"))
