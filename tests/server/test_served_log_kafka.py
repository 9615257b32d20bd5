"""The served log's Kafka sink behind ``offgraph serve --served-log-kafka kafka://HOST:PORT/TOPIC`` and the real
Tansu broker (``offgraph.testing.tansu``): at rate 1 with the broker up, every request's record on the topic (two
workers, each its own writer; every protocol), re-scored by the library to the answered scores, fp32 exact; with
the broker never started, then killed mid-run, no request fails, every record not written is counted dropped on
/metrics (dropped = requests - records written), and records flow again once the broker is back."""

import httpx
import numpy as np
import pytest
from polling import wait_for
from served_log_helpers import check_logged, metric, score_every_protocol
from server_helpers import copy_models, serve_process, stop_server, wait_ready

from offgraph.server.process.served_log_kafka import read_served_kafka
from offgraph.testing.harness import free_port
from offgraph.testing.tansu import TansuBroker

pytestmark = pytest.mark.timeout(400)

DROPPED, WRITTEN = "offgraph_served_log_dropped_total", "offgraph_served_log_records_total"


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
