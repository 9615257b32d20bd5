"""The served log's Kafka sink behind ``offgraph serve --served-log-kafka kafka://HOST:PORT/TOPIC`` and the real
Tansu broker (``offgraph.testing.tansu``): at rate 1 with the broker up, every request's record on the topic (two
workers, each its own writer; every protocol), re-scored by the library to the answered scores, fp32 exact; with
the broker never started, then killed mid-run, no request fails, every record not written is counted dropped on
/metrics (dropped = requests - records written), and records flow again once the broker is back."""

import httpx
import numpy as np
import pytest
from polling import wait_for
from served_log_helpers import DROPPED, WRITTEN, check_logged, metric, score_every_protocol
from server_helpers import copy_models, serve_process, stop_server, wait_ready

from offgraph.server.process.served_log_kafka import read_served_kafka
from offgraph.testing.harness import free_port
from offgraph.testing.tansu import TansuBroker

pytestmark = pytest.mark.timeout(400)


def test_every_record_reaches_the_topic_from_two_workers(tiny_model, requests_, tmp_path):
    broker = TansuBroker(tmp_path / "tansu.log")
    url = f"kafka://{broker.start()}/served"
    models = copy_models(tiny_model[0], tmp_path / "models")
    grpc_port = free_port()
    flags = ("--workers", "2", "--grpc-port", str(grpc_port), "--served-log-rate", "1", "--served-log-kafka", url)
    proc, base = serve_process(models, tmp_path / "serve.log", *flags)
    sent: dict = {}
    try:
        wait_ready(base, 180, proc, log=str(tmp_path / "serve.log"))
        with httpx.Client(base_url=base, timeout=30) as http:
            meta = http.get("/v2/models/ml").json()
            for i, (req, cands) in enumerate(requests_[:4]):
                sent |= score_every_protocol(http, f"127.0.0.1:{grpc_port}", meta, req, cands[:30], str(i))
            wait_for(lambda: metric(http.get("/metrics").text, WRITTEN) == len(sent), 60, "every record written")
            assert metric(http.get("/metrics").text, DROPPED) == 0
        check_logged(read_served_kafka(url), sent, models / "ml" / "1")
    finally:
        stop_server(proc, 60)
        broker.kill()
    assert len(sent) == 4 * 6


def test_a_broker_down_drops_and_counts_never_failing_a_request_and_writing_resumes(tiny_model, requests_, tmp_path):
    broker = TansuBroker(tmp_path / "tansu.log")  # its port chosen, not started yet
    url = f"kafka://{broker.bootstrap}/served"
    models = copy_models(tiny_model[0], tmp_path / "models")
    proc, base = serve_process(models, tmp_path / "serve.log", "--served-log-rate", "1", "--served-log-kafka", url)
    req, cands = requests_[0]
    ids: list[str] = []
    try:
        wait_ready(base, 120, proc, log=str(tmp_path / "serve.log"))
        with httpx.Client(base_url=base, timeout=30) as http:

            def send(n: int) -> None:
                for _ in range(n):
                    rid = f"r{len(ids)}"
                    r = http.post(
                        "/v1/models/ml:score", json={"request": req, "candidates": cands}, headers={"x-request-id": rid}
                    )
                    assert r.status_code == 200, r.text
                    ids.append(rid)

            def counts() -> tuple[float, float]:
                text = http.get("/metrics").text
                return metric(text, DROPPED), metric(text, WRITTEN)

            def resumed(written_before: float) -> None:
                """Requests until a record is written again; then every record is counted, one way or the other."""

                def one_more() -> bool:
                    send(1)
                    return counts()[1] > written_before

                wait_for(one_more, 60, "records written again", interval=0.1)
                wait_for(lambda: sum(counts()) == len(ids), 60, "every record written or dropped")

            # never started: every record dropped and counted
            send(10)
            wait_for(lambda: counts() == (10, 0), 60, "10 records dropped, none written")
            broker.start()
            resumed(0)
            dropped_up, written_up = counts()
            # killed mid-run: the records meanwhile are dropped, none written
            broker.kill()
            send(10)
            wait_for(lambda: counts() == (dropped_up + 10, written_up), 60, "10 more dropped, none written")
            # restarted (empty: Tansu's storage is in memory): written again
            broker.start()
            resumed(written_up)
            dropped, written = counts()
        assert dropped + written == len(ids) and dropped >= 20 and written > written_up
        after_restart = read_served_kafka(url).column("request_id").to_pylist()
        assert len(after_restart) == written - written_up and len(set(after_restart)) == len(after_restart)
        assert set(after_restart) <= set(ids[int(dropped_up + written_up) + 10 :])
        logged_scores = np.float32(read_served_kafka(url).column("scores").to_pylist())
        assert logged_scores.shape == (len(after_restart), len(cands))
    finally:
        stop_server(proc, 60)
        broker.kill()


def test_a_batch_bigger_than_a_message_is_split_into_streams_that_each_fit():
    """``encode_streams``: halves until each stream fits ``max_bytes`` (a row alone bigger: one stream of it); the
    streams read back, in order, are the table."""
    import pyarrow as pa

    from offgraph.server.process.served_log_base import schema
    from offgraph.server.process.served_log_kafka import encode_streams

    rng = np.random.default_rng(0)
    rows = 40
    texts = [[rng.bytes(3000).hex() for _ in range(4)] for _ in range(rows)]  # ~24 kB of incompressible text a row
    table = pa.Table.from_pydict(
        {
            "request_id": [f"r{i}" for i in range(rows)],
            "time": [i for i in range(rows)],
            "model": ["ml"] * rows,
            "version": [1] * rows,
            "arm": ["none"] * rows,
            "request": ["{}"] * rows,
            "candidates": texts,
            "scores": [[0.5] * 4] * rows,
            "order": [[0, 1, 2, 3]] * rows,
        },
        schema=schema(),
    )
    streams = encode_streams(table, max_bytes=100_000)
    # a row is ~12 kB compressed (hex of random bytes: zstd halves it): halved 40 -> 20 -> 10 (120 kB) -> 5 (60 kB)
    assert [n for n, _ in streams] == [5] * 8
    assert all(len(s) <= 100_000 for _, s in streams)
    back = pa.concat_tables([pa.ipc.open_stream(s).read_all() for _, s in streams])
    assert back.equals(table)
    (one,) = encode_streams(table.slice(0, 1), max_bytes=100)  # a row alone bigger than a message: as it is
    assert one[0] == 1 and len(one[1]) > 100
