"""A gRPC call whose deadline passes while it waits its turn in the scoring pool is answered DEADLINE_EXCEEDED and
never scored, for TF Serving's ``Predict`` (tensorflow-serving-api stubs) and KServe v2's ``ModelInfer``
(``tritonclient.grpc``), on a real ``offgraph serve --grpc-port`` with one scoring thread.

The pool is kept busy by a backlog of large calls sent first, each with candidates of its own (a candidate the
candidate cache holds costs the server little, and the backlog must be work); the late call is sent once the first of them has
been answered (so the backlog is on the server, not in the client), with a deadline far shorter than the backlog
left. "Not scored" is read from the store's own work: every scored candidate looks its rows up in the row cache
(``offgraph_row_cache_hits`` + ``offgraph_row_cache_misses``, counted by the scorer), so over the whole run the
lookups must be exactly those of the large calls, with none of the late call's."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from grpc_helpers import predict, predict_request, tensors
from server_helpers import copy_models, free_port, serve_process, stop_server, wait_ready
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tritonclient.utils import InferenceServerException

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BACKLOG = 10  # large calls queued ahead of the late one
BIG = 2000  # their candidates (--max-candidates' default)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """(url, gRPC address) of a server with one scoring thread: calls wait their turn one after another."""
    tmp = tmp_path_factory.mktemp("grpc-deadlines")
    models = copy_models(tiny_model[0], tmp / "models")
    gport = free_port()
    proc, url = serve_process(models, tmp / "serve.log", "--grpc-port", str(gport), "--score-threads", "1")
    try:
        wait_ready(url, 120, proc, log=str(tmp / "serve.log"))
        yield url, f"127.0.0.1:{gport}"
    finally:
        stop_server(proc)


def _lookups(url: str) -> int:
    """Row-cache lookups of model ml so far (hits + misses)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    got = re.findall(r'^offgraph_row_cache_(?:hits|misses)_total\{model="ml"\} ([0-9.e+]+)$', text, re.M)
    assert len(got) == 2, text[-2000:]
    return int(sum(float(v) for v in got))


def _deadline_errors(url: str, method: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    pattern = (
        rf'^offgraph_http_errors_total\{{code="DEADLINE_EXCEEDED",model="ml",route="{re.escape(method)}"\}} (\S+)$'
    )
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def _work_of(url: str, call) -> tuple[int, float]:
    """(row-cache lookups, seconds) of one ``call()`` alone: the same both times it is made (else the lookups
    could not tell a call apart)."""
    runs = []
    for _ in range(2):
        before, t = _lookups(url), time.perf_counter()
        call()
        runs.append((_lookups(url) - before, time.perf_counter() - t))
    assert runs[0][0] == runs[1][0] > 0, runs
    return runs[1]


def _late_call_not_scored(url: str, big_call, late_call, method: str) -> None:
    """``BACKLOG`` × ``big_call`` in flight, then ``late_call(timeout)`` with a deadline shorter than what remains of
    the backlog: DEADLINE_EXCEEDED, and the run's lookups are the large calls' alone."""
    per_big, big_s = _work_of(url, lambda: big_call(60, 0))
    per_late, _ = _work_of(url, lambda: late_call(30))
    deadline_s = max(0.05, 2 * big_s)  # the late call waits behind BACKLOG - 1 (>= 9) large calls
    errors_before, before = _deadline_errors(url, method), _lookups(url)
    with ThreadPoolExecutor(BACKLOG) as pool:
        backlog = [pool.submit(big_call, 60, i + 1) for i in range(BACKLOG)]
        next(as_completed(backlog, timeout=120)).result()  # one answered: the rest are queued on the server
        t = time.perf_counter()
        late = late_call(deadline_s)
        waited = time.perf_counter() - t
        answered = sum(f.done() for f in backlog)
        for f in backlog:
            f.result(timeout=120)  # every large call scored
    assert late == "DEADLINE_EXCEEDED", late
    assert answered < BACKLOG, "the backlog was gone before the late call's deadline passed"
    assert waited < deadline_s + 1.0, waited  # answered at its deadline, not after its turn
    lookups = _lookups(url) - before
    print(
        f"{method}: large call {big_s * 1000:.0f} ms, late deadline {deadline_s * 1000:.0f} ms, "
        f"answered after {waited * 1000:.0f} ms; lookups {lookups} = {BACKLOG} x {per_big} (late call: {per_late}); "
        f"server-side DEADLINE_EXCEEDED counted: {_deadline_errors(url, method) - errors_before:.0f}"
    )
    assert lookups == BACKLOG * per_big, (lookups, per_big, per_late)
    assert _deadline_errors(url, method) - errors_before == 1  # the server counts what its client saw


def _big_candidates(requests_, variant: int) -> tuple[dict, list[dict]]:
    """``BIG`` candidates; each ``variant`` moves every release year by its own thousandths of a year, so that no two
    variants share a candidate and each makes the same row lookups (a year's bucket holds the year and its next
    hundredth)."""
    request, _ = requests_[0]
    pool = [c for _, cands in requests_ for c in cands]
    cands = (pool * (BIG // len(pool) + 1))[:BIG]
    moved = [
        c if c["release_year"] is None else {**c, "release_year": c["release_year"] + variant / 1000} for c in cands
    ]
    return request, moved


def test_predict_deadline_passed_in_the_queue_is_not_scored(server, requests_):
    url, address = server
    channel = grpc.insecure_channel(address)
    bigs = [predict_request(*_big_candidates(requests_, i)) for i in range(BACKLOG + 1)]
    late = predict_request(*requests_[1])
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)

    def late_call(timeout: float) -> str:
        try:
            predict(channel, late, timeout)
        except grpc.RpcError as e:
            return e.code().name
        return "OK"

    try:
        _late_call_not_scored(
            url,
            lambda timeout, i: stub.Predict(bigs[i], timeout=timeout),
            late_call,
            "/tensorflow.serving.PredictionService/Predict",
        )
    finally:
        channel.close()


def test_model_infer_deadline_passed_in_the_queue_is_not_scored(server, requests_):
    url, address = server
    meta = httpx.get(f"{url}/v2/models/ml", timeout=10).json()
    client = tgrpc.InferenceServerClient(address)

    def inputs(req: dict, cands: list[dict]) -> list[tgrpc.InferInput]:
        out = []
        for name, datatype, arr in tensors(meta, req, cands):
            t = tgrpc.InferInput(name, list(arr.shape), datatype)
            t.set_data_from_numpy(arr)
            out.append(t)
        return out

    bigs = [inputs(*_big_candidates(requests_, i)) for i in range(BACKLOG + 1)]
    late = inputs(*requests_[1])

    def big_call(timeout: float, i: int) -> np.ndarray:
        return client.infer("ml", bigs[i], client_timeout=timeout).as_numpy("scores")

    def late_call(timeout: float) -> str:
        try:
            client.infer("ml", late, client_timeout=timeout)
        except InferenceServerException as e:
            return str(e.status()).removeprefix("StatusCode.")
        return "OK"

    try:
        _late_call_not_scored(url, big_call, late_call, "/inference.GRPCInferenceService/ModelInfer")
    finally:
        client.close()
