"""bench/serve_breakdown.py's per-request phases by protocol (``bench.lib.breakdown.run_breakdown`` with gRPC
messages), run as the bench runs it, in a child process on a real exported model: REST ``:score`` and each gRPC
protocol's named-tensor path report their phases, the same candidates score alike, and the report's lines name
them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.lib.bodies import build_bodies
from bench.lib.breakdown import breakdown_lines, run_breakdown
from bench.lib.grpc_client import grpc_bodies
from offgraph.modeldir.version import ModelVersion
from offgraph.server.api.model_inputs import describe_inputs, shape
from offgraph.server.api.tensor_inputs import metadata_datatype

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]


def test_per_request_phases_of_rest_and_each_grpc_protocol(tiny_model, tmp_path):
    models, table = tiny_model
    version = models / "ml" / "1"
    data = tmp_path / "ml.parquet"
    pq.write_table(table, data)
    spec = ModelVersion.open(version).spec
    n = 50
    bodies = build_bodies(data, [n], 4, 0)
    inputs = [{"name": i.name, "datatype": metadata_datatype(i), "shape": shape(i)} for i in describe_inputs(spec)]
    messages = {p: grpc_bodies(p, "ml", bodies, inputs)[n] for p in ("kserve", "tfserving")}
    b = run_breakdown(REPO, version, bodies[n], 5, 16, 1, 1, messages)
    per = b["per_request_ms"]
    assert set(per) == {"rest", "kserve", "tfserving"}, per
    assert set(per["rest"]) == {"parse", "score", "total"}
    for p in ("kserve", "tfserving"):
        assert set(per[p]) == {"parse", "tensors", "convert", "score", "total"}
        assert all(v >= 0 for v in per[p].values()) and per[p]["score"] > 0
    lines = "\n".join(breakdown_lines("new", b))
    assert "per request, kserve (ms, medians): parse" in lines and "per request, tfserving" in lines
    json.dumps(b)  # the report is JSON
