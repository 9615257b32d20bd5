"""ServerConfig: everything ``create_app`` needs, validated once."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

ADMIN_TOKEN_ENV = "OFFGRAPH_ADMIN_TOKEN"
MiB = 1 << 20


@dataclass(frozen=True)
class HttpLimits:
    """Connection limits of a server process (enforced by ``server.http_limits``).

    header_timeout_s: a request's line and headers must arrive within this, from the connection's
        opening or the next request's first byte (then 408, or a close if nothing came).
    body_timeout_s: its whole body within this of its headers (then 408 and close).
    keep_alive_timeout_s: an idle kept-alive connection is closed after this.
    max_connections: open connections per process; past it the connection idle the longest is
        closed, or, with none idle, the new connection's request gets a 503.
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_timeout_s: float = 5.0
    max_connections: int = 1000

    def __post_init__(self) -> None:
        for name, flag in (("header_timeout_s", "--header-timeout"), ("body_timeout_s", "--body-timeout"),
                           ("keep_alive_timeout_s", "--keep-alive-timeout")):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 86400:
                raise ValueError(f"HttpLimits.{name} ({flag}) must be a number of seconds > 0 (and < 1 day), "
                                 f"got {v!r}")
        v = self.max_connections
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"HttpLimits.max_connections (--max-connections) must be an integer >= 1, got {v!r}")


@dataclass(frozen=True)
class ServerConfig:
    """Settings of one server process.

    models_dir: MODELS; every ``MODELS/<name>/`` with a complete version is served.
    cache_mb: row-cache budget (MiB) of the whole server, split evenly between the models
        (each scorer gets ``cache_mb / number of models`` as ``row_cache_mb``).
    max_candidates: most candidates in one score request.
    max_body_bytes: largest request body (Content-Length and streamed size).
    max_request_values: most feature values one score request may hold (request fields once,
        item and cross fields once per candidate; ``features.value_limits``): bounds a request's
        work beside the spec's per-field ``max_values``.
    http: the connection limits (``HttpLimits``).
    poll_seconds: how often MODELS is scanned for new versions.
    admin_token: bearer token of the admin actions; None disables them (403).
    score_threads: size of the thread pool running ``Scorer.score``.
    intra_threads / inter_threads: TensorFlow thread pools; None leaves TF's default
        (the CLI always sets them).
    follow_interval_s: how often a scorer reads its store's write feed (fresh rows from the live
        writer: plain file reads, ``exporter.follower``).
    catch_up_s: how often a scorer's RocksDB secondary catches up with the writer (each catch-up
        holds the GIL for milliseconds per shard, so rarely; the feed keeps rows fresh meanwhile).
    item_cache_size: per-model FG item cache (items).
    warmup_candidates: candidates in the warm-up request of a freshly loaded version.
    verify: check the dense model's checksums when a version loads.
    tune_gc: ``gc.freeze()`` the objects alive when the app is built (TF's ~400k) and raise the
        young-generation threshold (see ``server.gc_tuning``).
    workers / worker_id / control_dir: set by ``server.workers`` when several worker processes
        share the port: admin actions are recorded in ``control_dir`` and every worker follows
        them (``server.control``); metrics are aggregated over the workers (Prometheus
        multiprocess mode). One process (the default): ``workers=1`` and no control_dir.
    """

    models_dir: Path
    cache_mb: float = 256.0
    max_candidates: int = 2000
    max_body_bytes: int = 8 * MiB
    max_request_values: int = 100_000
    http: HttpLimits = HttpLimits()
    poll_seconds: float = 2.0
    admin_token: str | None = None
    score_threads: int = 4
    intra_threads: int | None = None
    inter_threads: int | None = None
    follow_interval_s: float = 0.05
    catch_up_s: float = 30.0
    item_cache_size: int = 100_000
    warmup_candidates: int = 200
    verify: bool = True
    tune_gc: bool = True
    workers: int = 1
    worker_id: int = 0
    control_dir: Path | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "models_dir", Path(self.models_dir))
        if not self.models_dir.is_dir():
            raise ValueError(f"--models {self.models_dir}: not a directory")
        if self.control_dir is not None:
            object.__setattr__(self, "control_dir", Path(self.control_dir))
        if not (isinstance(self.workers, int) and self.workers >= 1 and 0 <= self.worker_id < self.workers):
            raise ValueError(f"ServerConfig: workers must be >= 1 and 0 <= worker_id < workers, got workers="
                             f"{self.workers!r}, worker_id={self.worker_id!r}")
        if self.workers > 1 and self.control_dir is None:
            raise ValueError("ServerConfig: several workers need a control_dir (admin actions are shared there)")
        if self.admin_token is not None and not self.admin_token.strip():
            object.__setattr__(self, "admin_token", None)
        checks = [
            ("cache_mb", self.cache_mb, 0), ("max_candidates", self.max_candidates, 1),
            ("max_body_bytes", self.max_body_bytes, 1024), ("poll_seconds", self.poll_seconds, 0.01),
            ("max_request_values", self.max_request_values, 1),
            ("score_threads", self.score_threads, 1), ("follow_interval_s", self.follow_interval_s, 0.001),
            ("catch_up_s", self.catch_up_s, 0.01),
            ("item_cache_size", self.item_cache_size, 0), ("warmup_candidates", self.warmup_candidates, 1),
        ]
        for name, value, low in checks:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ValueError(f"ServerConfig.{name} must be a number >= {low}, got {value!r}")
        if not isinstance(self.max_request_values, int):
            raise ValueError(f"ServerConfig.max_request_values must be an integer, got {self.max_request_values!r}")
        if not isinstance(self.http, HttpLimits):
            raise ValueError(f"ServerConfig.http must be an HttpLimits, got {self.http!r}")
        for name in ("intra_threads", "inter_threads"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"ServerConfig.{name} must be an integer >= 1 or None, got {v!r}")

    @staticmethod
    def admin_token_from_env() -> str | None:
        return os.environ.get(ADMIN_TOKEN_ENV) or None
