"""The model, requests and scorer the streaming-update benches (``bench.update_freshness``,
``bench.kafka_replicas``) share: which stored rows a request reads, and scoring it over HTTP."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NAME = "ml"


def build_requests(spec, data: Path, n_requests: int, n_candidates: int, seed: int = 0):
    """``n_requests`` (request, candidates) pairs from the data: distinct users, movies drawn at random."""
    import pyarrow.parquet as pq

    t = pq.read_table(data)
    req_cols, item_cols = spec.raw_inputs("request"), spec.raw_inputs("item")
    rows = t.select(sorted(set(req_cols) | set(item_cols))).to_pylist()
    rng = np.random.default_rng(seed)
    users, items, seen_u, seen_i = [], [], set(), set()
    for r in rows:
        u = tuple(json.dumps(r[c]) for c in req_cols)
        i = tuple(json.dumps(r[c]) for c in item_cols)
        if u not in seen_u:
            seen_u.add(u)
            users.append({c: r[c] for c in req_cols})
        if i not in seen_i:
            seen_i.add(i)
            items.append({c: r[c] for c in item_cols})
    out = []
    for k in range(n_requests):
        cands = [items[j] for j in rng.choice(len(items), n_candidates, replace=False)]
        out.append((users[k % len(users)], cands))
    return out


@dataclass(frozen=True)
class BenchModel:
    """An exported version as these benches drive it, read once through the library scorer (``offgraph.load``)."""

    dim: int
    quant: str
    shards: int
    table_rows: np.ndarray  # int64 [tables]: rows of each table, by table id
    requests: list  # (request, candidates) pairs drawn from the data
    probe: tuple  # (request, candidates): the request whose scores the freshness probes watch
    probe_row: tuple[int, int]  # (table id, row): the probe request's user row, which the probe deltas change
    probe_rows: dict  # table id -> int64 rows: every row scoring the probe request reads (load deltas avoid them)


def rows_read(model, request, candidates) -> dict[int, np.ndarray]:
    """Table id -> the distinct rows that scoring ``(request, candidates)`` reads (``Scorer.features``: the FG the
    server runs; a field's table id is its index)."""
    batch = model.features(request, candidates)
    return {tid: np.unique(f.ids) for tid, f in enumerate(batch.fields) if len(f.ids)}


def open_bench_model(src: Path, data: Path, n_requests: int, n_candidates: int, n_probe: int) -> BenchModel:
    import offgraph

    model = offgraph.load(src, verify=False)
    try:
        spec = model.spec
        reqs = build_requests(spec, data, n_requests, n_candidates)
        request, cands = reqs[0][0], reqs[0][1][:n_probe]
        tid = [f.scope for f in spec.fields].index("request")
        user = rows_read(model, request, cands[:1]).get(tid, np.zeros(0, np.int64))
        if len(user) != 1:
            raise ValueError(f"expected one row of field {spec.fields[tid].name}, got {user}")
        store = json.loads((Path(src) / "manifest.json").read_text())["store"]  # the documented manifest format
        return BenchModel(
            dim=model.dim,
            quant=store["quant"],
            shards=store["shards"],
            table_rows=np.array([f.rows for f in spec.fields]),
            requests=reqs,
            probe=(request, cands),
            probe_row=(tid, int(user[0])),
            probe_rows=rows_read(model, request, cands),
        )
    finally:
        model.close()


def outside(t: np.ndarray, r: np.ndarray, rows: dict[int, np.ndarray]) -> np.ndarray:
    """bool [k]: ``(t[i], r[i])`` is none of ``rows`` (table id -> rows)."""
    keep = np.ones(len(r), dtype=bool)
    for tid, table_rows in rows.items():
        keep &= ~((t == tid) & np.isin(r, table_rows))
    return keep


class HttpScorer:
    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def score(self, request, candidates) -> list[float]:
        body = json.dumps({"request": request, "candidates": candidates})
        try:
            self.conn.request("POST", f"/v1/models/{NAME}:score", body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):  # the server closed an idle keep-alive
            self.conn.close()
            self.conn.request("POST", f"/v1/models/{NAME}:score", body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"score: HTTP {resp.status}: {data[:300]!r}")
        return json.loads(data)["scores"]

    def stats(self) -> dict:
        self.conn.request("GET", f"/v1/models/{NAME}")
        resp = self.conn.getresponse()
        data = json.loads(resp.read())
        return (data.get("loaded") or {}).get("store") or data
