"""ServerConfig: everything ``create_app`` needs, validated once (pydantic, ``offgraph.config``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from offgraph.config import ConfigModel, option
from offgraph.objectstore.base import Location, check_scheme, scheme_of
from offgraph.scoring.memory_budget import DEFAULT_MEMORY_MB, MemorySplit, split_memory

ADMIN_TOKEN_ENV = "OFFGRAPH_ADMIN_TOKEN"
MiB = 1 << 20
DAY_S = 86400.0

# a path given as a str is taken too (the models are strict otherwise)
LaxPath = Annotated[Path, Field(strict=False)]


class HttpLimits(ConfigModel, frozen=True):
    """Connection limits of a server process (enforced by ``offgraph.server.http.http_limits``).

    header_timeout_s: a request's line and headers must arrive within this, from the connection's
        opening or the next request's first byte (then 408, or a close if nothing came).
    body_timeout_s: its whole body within this of its headers (then 408 and close).
    keep_alive_timeout_s: an idle kept-alive connection is closed after this.
    max_connections: open connections per process; past it the connection idle the longest is
        closed, or, with none idle, the new connection's request gets a 503.
    Timeouts are seconds, > 0 and < 1 day.
    """

    header_timeout_s: float = option(
        10.0,
        gt=0,
        lt=DAY_S,
        flag="--header-timeout",
        description="seconds for a request's line and headers to arrive, from the connection's opening or the "
        "next request's first byte (then 408 or close)",
    )
    body_timeout_s: float = option(
        30.0,
        gt=0,
        lt=DAY_S,
        flag="--body-timeout",
        description="seconds for a request's whole body to arrive after its headers (then 408 and close)",
    )
    keep_alive_timeout_s: float = option(
        5.0, gt=0, lt=DAY_S, flag="--keep-alive-timeout", description="seconds an idle kept-alive connection stays open"
    )
    max_connections: int = option(
        1000,
        ge=1,
        flag="--max-connections",
        description="open connections per server process; past it the connection idle the longest is closed, "
        "and with none idle a new connection's request gets a 503",
    )


class ServerConfig(ConfigModel, frozen=True):
    """Settings of one server process.

    models_dir: MODELS; every ``MODELS/<name>/`` with a complete version is served.
    memory_mb: what the caches of ONE worker process may hold (MiB), all its models together: each
        model gets ``memory_mb / number of models``, split over its row cache (the big share), its
        store's RocksDB block cache (the version's index), its FG item cache and its feed mappings
        (``offgraph.scoring.memory_budget.split_memory``). The process's own memory (Python, TensorFlow, the
        dense models) comes on top: the default keeps a worker within 1 GB of PSS.
    cache_mb: None, or the row cache's size (MiB) of the whole server instead of its share of
        ``memory_mb``: split evenly between the workers and the models (each scorer gets
        ``cache_mb / workers / models``); the other parts keep their share of ``memory_mb``.
    max_candidates: most candidates in one score request.
    max_body_bytes: largest request body (Content-Length and streamed size).
    max_request_values: most feature values one score request may hold (request fields once,
        item and cross fields once per candidate; ``offgraph.features.value_limits``): bounds a request's
        work beside the spec's per-field ``max_values``.
    http: the connection limits (``HttpLimits``).
    poll_seconds: how often MODELS is scanned for new versions.
    admin_token: bearer token of the admin actions; None (or blank) disables them (403).
    admin_queue: admin calls of one model that may be under way or waiting for their turn at once (in each
        worker); one more is answered 429 with ``Retry-After`` at once. A call that the model's state refuses
        (unknown model or version, bad label, nothing to roll back to) is refused before it queues.
    admin_wait_s: how long an admin call waits for its turn (the loader busy with a load, or with the calls
        ahead of it) before it gives up with 429 and ``Retry-After``, having done nothing; a call whose turn
        came runs to its end (its own load included).
    score_threads: size of the thread pool running ``Scorer.score``. 2: the scorer holds the GIL
        for most of a request, so more threads mostly add contention (offgraph/server/README.md).
    intra_threads / inter_threads: TensorFlow thread pools; None leaves TF's default (an app
        built in a process that already ran TF ops cannot change them; the CLI's fresh process
        sets both to 1).
    blas_threads: NumPy's BLAS (OpenBLAS) threads, through threadpoolctl; None leaves them (the CLI sets 1: with
        one, the scorer's NumPy dense head serves every candidate count, ``offgraph.scoring.numpy_head``).
    follow_interval_s: how often a scorer reads its store's write feed (fresh rows from the live
        writer: plain file reads, ``offgraph.store.follower``).
    catch_up_s: how often a scorer's RocksDB secondary catches up with the writer (each catch-up
        holds the GIL for milliseconds per shard, so rarely; the feed keeps rows fresh meanwhile).
    item_cache_size: None, or the per-model FG item cache (items) instead of its share of ``memory_mb``.
    warmup_candidates: candidates in the warm-up request of a freshly loaded version.
    warmup_rows: a version that replaces another first reads up to this many of the serving
        version's most recently used rows (its row cache) into its own row cache and block cache,
        so its first requests are no slower than steady traffic (0: off; bounded time: a few
        seconds per 10^5 rows read from disk).
    hot_set_seconds: a version with nothing to take hot rows from (the first of its model, or
        ``warmup_rows`` 0) reads its static hot set (``offgraph.modeldir.hot_set``: recorded at export from
        its training data), hottest first, into its row cache for at most this long before it serves,
        by the read pool (0: off). Start-to-ready grows by this much at most.
    load_share: while a version serves, loading and warming the next takes at most this share of
        the wall clock (``offgraph.server.models.pacing``: pauses between its steps), so that a busy server's
        requests keep the rest; 1 loads flat out. With nothing serving yet, a load runs flat out. A
        retired version's memory is freed at this pace or a tenth of the time, whichever is less
        (``Scorer.release``).
    store_io: how the stores' files are read: ``direct`` (O_DIRECT, the default: past the OS page cache, so
        what is cached is what this process holds and accounts for, and a request's latency follows from
        the hit ratio and the disk, whatever the kernel keeps or reclaims) or ``buffered`` (through the page
        cache, with ``prefetch_store``: for a machine whose RAM holds the stores, where the page cache
        spares the row cache's first-sighting misses their device reads; bench/results/scale/).
    prefetch_store: read each version's store files into the OS page cache before the version serves
        (``offgraph.store.prefetch``; waiting at most ``offgraph.server.models.loader.PREFETCH_WAIT_S``), so that no request
        waits on a cold block from disk: ``auto`` when they take at most half the available memory (a
        table bigger than that is read from disk as requests need it), ``on``, ``off``.
    prefetch_mb_s: the prefetch's read rate limit in MiB/s (0: none) while the server answers
        requests, so that requests that still read the disk keep most of it; with nothing serving
        yet the prefetch reads as fast as the disk goes.
    served_log_rate / served_log_dir / served_log_kafka / served_log_queue: the served log
        (``offgraph.server.process.served_log``): the share of scored requests logged (0: off), its one sink (a
        spool folder of Arrow files, or a ``kafka://HOST:PORT/TOPIC``), and its bounded queue per worker.
    verify: check the dense model's checksums when a version loads.
    tune_gc: ``gc.freeze()`` the objects alive when the app is built (TF's ~400k), raise the
        young-generation threshold and collect the young generation every 250 ms (see
        ``offgraph.server.process.gc_tuning``).
    workers / worker_id / control_dir: set by ``offgraph.server.process.workers`` when several worker processes
        share the port: admin actions are recorded in ``control_dir`` and every worker follows
        them (``offgraph.server.models.control``); metrics are aggregated over the workers (Prometheus
        multiprocess mode). One process (the default): ``workers=1`` and no control_dir.
    """

    models_dir: LaxPath = option(
        flag="--models",
        description="MODELS directory: serves every MODELS/<name>/ at its newest complete version; or "
        "s3://BUCKET/PREFIX: the versions there are copied down into --model-cache-dir, verified, and served "
        "from it (endpoint and credentials: the AWS variables and files, AWS_ENDPOINT_URL included)",
    )
    models_uri: str | None = None  # --models when it names object storage; models_dir is then the cache
    model_cache_dir: LaxPath | None = option(
        None,
        flag="--model-cache-dir",
        shown="$XDG_CACHE_HOME/offgraph/models/BUCKET/PREFIX",
        description="with --models s3://...: the local folder versions are copied down into (each is verified "
        "against the checksums recorded at export before it loads)",
    )
    model_cache_mb: float = option(
        10240.0,
        gt=0,
        flag="--model-cache-mb",
        description="with --models s3://...: the most the copied-down versions may take on disk, in MiB; a new "
        "version evicts the oldest versions that no label or pin holds and that do not serve",
    )
    memory_mb: float = option(
        DEFAULT_MEMORY_MB,
        gt=0,
        flag="--memory-mb",
        description="what the caches of EACH worker process may hold, in MiB, all its models together (the "
        "default keeps a worker within 1 GB of PSS, TensorFlow included). Each model gets an even share, "
        "split over its row cache (the big share), its store's block cache (the version's index), its FG "
        "item cache and its write-feed mappings; logged at start, on /metrics and in GET /v1/models/NAME",
    )
    cache_mb: float | None = option(
        None,
        ge=0,
        flag="--cache-mb",
        shown="the share",
        description="row cache of the whole server in MiB instead of its share of --memory-mb, split between "
        "the workers and the models; the other parts keep theirs",
    )
    max_candidates: int = option(2000, ge=1, flag="--max-candidates", description="most candidates per request")
    max_body_bytes: int = option(
        8 * MiB, ge=1024, flag="--max-body-mb", unit=MiB, description="largest request body in MiB"
    )
    max_request_values: int = option(
        100_000,
        ge=1,
        flag="--max-request-values",
        description="most feature values in one score request: request fields once, item and cross fields once "
        "per candidate (more is a 422). Each id/tokenize field also has its own per-row max_values in the "
        "model's feature spec",
    )
    http: HttpLimits = HttpLimits()
    poll_seconds: float = option(2.0, ge=0.01, flag="--poll-seconds", description="how often MODELS is scanned")
    admin_token: str | None = option(
        None,
        flag="--admin-token",
        shown=f"${ADMIN_TOKEN_ENV}; none: admin disabled",
        description="bearer token of the admin actions",
    )
    admin_queue: int = option(
        4,
        ge=1,
        le=1000,
        flag="--admin-queue",
        description="admin calls of one model under way or waiting for their turn at once, in each worker; "
        "one more is answered 429 with Retry-After at once (calls the model's state refuses, e.g. an unknown "
        "version, are refused at once and never queue)",
    )
    admin_wait_s: float = option(
        5.0,
        gt=0,
        le=3600,
        flag="--admin-wait-seconds",
        description="seconds an admin call waits for its turn (a version load, the calls ahead of it) before it "
        "gives up, having done nothing, with 429 and Retry-After; a call whose turn came runs to its end",
    )
    score_threads: int = option(
        2,
        ge=1,
        flag="--score-threads",
        description="threads running the scorer in each worker (the scorer holds the GIL for most of a "
        "request, so more threads mostly add contention)",
    )
    intra_threads: int | None = option(
        None,
        ge=1,
        flag="--intra-threads",
        description="TensorFlow intra-op threads (per-request graphs are small; concurrency comes from "
        "--score-threads)",
    )
    inter_threads: int | None = option(None, ge=1, flag="--inter-threads", description="TensorFlow inter-op threads")
    blas_threads: int | None = option(
        None,
        ge=1,
        flag="--blas-threads",
        description="NumPy's BLAS threads (the NumPy dense head's matmuls; with 1 it scores every candidate count)",
    )
    follow_interval_s: float = option(
        0.05,
        ge=0.001,
        flag="--follow-seconds",
        description="how often each model reads the live updater's feed of applied rows: the freshness of "
        "streamed rows (plain file reads)",
    )
    catch_up_s: float = option(
        30.0,
        ge=0.01,
        flag="--catch-up-seconds",
        description="how often each model's RocksDB view catches up with the updater (a catch-up holds the "
        "GIL for milliseconds per shard, the feed keeps rows fresh meanwhile)",
    )
    item_cache_size: int | None = Field(None, ge=0)
    warmup_candidates: int = Field(200, ge=1)
    warmup_rows: int = option(
        100_000,
        ge=0,
        flag="--warmup-rows",
        description="rows of the serving version's row cache (most recently used first) a new version of the "
        "model reads into its caches before it replaces it (0: off)",
    )
    hot_set_seconds: float = option(
        4.0,
        ge=0,
        le=3600,
        flag="--hot-set-seconds",
        description="a version that replaces none reads its static hot set (the rows its training data looked "
        "up most, recorded at export) into its row cache for at most this long before it serves (0: off)",
    )
    load_share: float = option(
        0.25,
        gt=0,
        le=1,
        flag="--load-share",
        description="while a version serves, loading and warming the next takes at most this share of the "
        "time, so that its requests keep the rest (1: flat out)",
    )
    store_io: Literal["direct", "buffered"] = option(
        "direct",
        flag="--store-io",
        description="read the stores' files with direct I/O, past the OS page cache (predictable beyond RAM: "
        "what is cached is this process's own), or buffered through the page cache (a machine whose RAM "
        "holds the stores; --prefetch-store then applies)",
    )
    prefetch_store: Literal["auto", "on", "off"] = option(
        "auto",
        flag="--prefetch-store",
        description="read each version's store files into the OS page cache before it serves, so that "
        "requests do not wait on cold blocks from disk: auto when they take at most half the available memory",
    )
    prefetch_mb_s: float = option(
        256.0,
        ge=0,
        flag="--prefetch-mb-s",
        description="read rate limit of the prefetch in MiB/s while requests are served (0: none; with "
        "nothing serving yet it reads as fast as the disk goes)",
    )
    served_log_rate: float = option(
        0.0,
        ge=0,
        le=1,
        flag="--served-log-rate",
        shown="0: off",
        description="share of scored requests (all protocols) logged to the served log, sampled by a hash of the "
        "request id (1: every request); needs one sink, --served-log-dir or --served-log-kafka. Off the request "
        "path: when the sink is slow or down, records are dropped and counted (offgraph_served_log_dropped_total)",
    )
    served_log_dir: LaxPath | None = option(
        None,
        flag="--served-log-dir",
        description="the served log's spool: a folder of Arrow IPC files, one per batch (each worker its own files)",
    )
    served_log_kafka: str | None = option(
        None,
        flag="--served-log-kafka",
        description="the served log's Kafka sink, kafka://HOST:PORT/TOPIC: each batch as Arrow IPC stream "
        "messages on TOPIC (created when missing)",
    )
    served_log_queue: int = option(
        10_000,
        ge=1,
        flag="--served-log-queue",
        description="served-log records waiting for the sink at most, per worker; more are dropped and counted",
    )
    verify: bool = True
    tune_gc: bool = True
    workers: int = Field(1, ge=1)  # set by offgraph.server.process.workers from ListenConfig.workers
    worker_id: int = Field(0, ge=0)
    control_dir: LaxPath | None = None

    @model_validator(mode="before")
    @classmethod
    def _models_in_object_storage(cls, data: Any) -> Any:
        """``--models s3://...``: remembered as ``models_uri``; the models are served from the cache folder."""
        raw = data.get("models_dir") if isinstance(data, dict) else None
        if not isinstance(raw, str) or scheme_of(raw) is None:
            return data
        check_scheme(raw)  # an unsupported scheme: refused naming it, never taken as a folder
        cache = data.get("model_cache_dir") or default_model_cache_dir(raw)
        try:
            Path(cache).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the model cache folder {cache}: {e}") from None
        return {**data, "models_uri": raw, "models_dir": Path(cache), "model_cache_dir": Path(cache)}

    @field_validator("models_dir", mode="before")
    @classmethod
    def _models_scheme(cls, v: Any) -> Any:
        if isinstance(v, str):
            check_scheme(v)
        return v

    @field_validator("models_dir")
    @classmethod
    def _models_dir_exists(cls, v: Path) -> Path:
        if not v.is_dir():
            raise ValueError(f"{v}: not a directory")
        return v

    @field_validator("admin_token")
    @classmethod
    def _blank_token_is_none(cls, v: str | None) -> str | None:
        return v if v is not None and v.strip() else None

    @field_validator("served_log_kafka")
    @classmethod
    def _kafka_url(cls, v: str | None) -> str | None:
        if v is not None:
            from offgraph.streaming.kafka.messages import parse_kafka_url

            parse_kafka_url(v)  # its ValueError names the fault
        return v

    @model_validator(mode="after")
    def _served_log_sink(self) -> ServerConfig:
        if self.served_log_dir is not None and self.served_log_kafka is not None:
            raise ValueError("the served log has one sink: --served-log-dir or --served-log-kafka, not both")
        if self.served_log_rate > 0 and self.served_log_dir is None and self.served_log_kafka is None:
            raise ValueError("--served-log-rate needs a sink: --served-log-dir DIR or --served-log-kafka URL")
        return self

    @model_validator(mode="after")
    def _workers(self) -> ServerConfig:
        if self.worker_id >= self.workers:
            raise ValueError(f"worker_id must be < workers, got workers={self.workers}, worker_id={self.worker_id}")
        if self.workers > 1 and self.control_dir is None:
            raise ValueError("several workers need a control_dir (admin actions are shared there)")
        return self

    def memory_split(
        self, models: int, index_mb: float = 0.0, versions: int = 1, item_tables: bool = False
    ) -> MemorySplit:
        """One version's share of this process's memory budget, with ``models`` models served and its model
        serving ``versions`` versions at once, its index needing ``index_mb``, ``item_tables``: whether it has
        item feature tables (``offgraph.scoring.memory_budget``)."""
        models, versions = max(1, models), max(1, versions)
        row = None if self.cache_mb is None else self.cache_mb / models / versions
        return split_memory(
            self.memory_mb,
            models,
            index_mb=index_mb,
            row_cache_mb=row,
            versions=versions,
            item_tables=item_tables,
            item_cache_items=self.item_cache_size,
        )


def default_model_cache_dir(uri: str) -> Path:
    """``$XDG_CACHE_HOME/offgraph/models/BUCKET/PREFIX`` (``~/.cache`` without it): one folder per URI."""
    loc = Location.parse(uri)
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "offgraph" / "models" / loc.bucket / loc.prefix


class ListenConfig(ConfigModel, frozen=True):
    """How `offgraph serve` runs its server: the address, the worker processes sharing the port
    (``offgraph.server.process.workers``; each then gets a ``ServerConfig`` with its ``workers`` and ``worker_id``),
    uvicorn's log level and how the server stops (``offgraph.server.process.graceful_stop``)."""

    host: str = option("127.0.0.1", flag="--host", description="address to listen on")
    port: int = option(8500, ge=0, le=65535, flag="--port", description="port to listen on (0: any free one)")
    grpc_port: int | None = option(
        None,
        ge=0,
        le=65535,
        flag="--grpc-port",
        shown="off",
        description="also serve gRPC on this port (TF Serving's PredictionService and ModelService, gRPC health; "
        "offgraph/server/README.md, gRPC), in the same worker processes as HTTP, on --host; off when not given",
    )
    workers: int = option(
        1,
        ge=1,
        flag="--workers",
        description="server processes sharing the port. One Python process scores on about one core; use "
        "about one worker per core the server may use. Admin actions reach every worker; metrics are "
        "summed; each worker has its own --memory-mb",
    )
    log_level: Literal["debug", "info", "warning", "error"] = option(
        "info", flag="--log-level", description="uvicorn's log level"
    )
    drain_seconds: float = option(
        5.0,
        ge=0,
        le=3600,
        flag="--drain-seconds",
        description="on SIGTERM or SIGINT, /readyz answers 503 at once and the server goes on answering for this "
        "long, so that load balancers take it out before it stops accepting (a second signal stops at once)",
    )
    stop_timeout_s: float = option(
        10.0,
        gt=0,
        le=3600,
        flag="--stop-timeout",
        description="after the drain, seconds the requests in flight get to finish before they are cancelled; "
        "the process exits 0 within --drain-seconds + --stop-timeout + about 2 s",
    )
