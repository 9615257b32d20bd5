"""Redis Cluster backend (``backend.StoreBackend`` over redis-py's cluster client): the rows live in a
cluster that every replica of a server shares, the store directory holds only ``store.json``.

Shard ``s`` of a store is ONE Redis hash, ``offgraph:{NAMESPACE/s}``: its fields are the store's
encoded keys (rows, their seq records, the shard's watermark and meta records, the updater's source
positions among them), its values the same quantized records as in RocksDB. The braces are a hash
tag: the whole shard is one slot, so a write batch, however many rows and positions it holds, is one
MULTI/EXEC on one master, applied all or nothing (``docs/DESIGN.md``, "A store beyond one machine").
A cluster spreads the shards over its masters by the tag's CRC16: give a store at least twice as many
shards as the cluster has masters.

Writes chain (mode ``"w"``): each batch also sets the shard's fence record to a token of this writer and
applies only if the fence still holds the token its previous batch set (one Lua script: checked and
written atomically). A failover that lost acknowledged batches (replication is asynchronous) leaves an
older token, and so does a second writer: the next batch is refused with :class:`StoreFenced`, nothing
written, and the updater restarts from the positions the shard really holds (``docs/DESIGN.md``). The
same script publishes the batch's row keys on the shard's sharded pub/sub channel: servers on other
machines drop them from their row caches (:meth:`RedisBackend.watch_changes`).

Reads are one HMGET per (shard, piece) of a request's misses, issued in parallel by the store's read
threads (``base.EmbeddingStore``), each bounded by ``StoreConfig.remote_timeout_ms``: a cluster that does
not answer is a :class:`~offgraph.store.errors.StoreUnavailable` (a 503), never a hang. Nothing is
cached here (``cache_usage`` is 0): the row cache in front of the store is the process's memory.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import errno
import itertools
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from offgraph.store.backend import StoreBackend
from offgraph.store.config import StoreConfig
from offgraph.store.errors import StoreRemoteError, StoreUnavailable
from offgraph.store.internal_keys import SHARD_CREATED_KEY, WRITE_FENCE_KEY
from offgraph.store.keys import KEY_BYTES, KEY_DTYPE, META_PREFIX, decode_keys, encode_keys, shard_of
from offgraph.store.sst_run import SstWriter

log = logging.getLogger("offgraph.store")

SEEK_SPAN = 8
"""A seek reads the next ``SEEK_SPAN * shards`` rows' keys of its shard (about ``SEEK_SPAN`` of them: the
chance that none is this shard's is about e^-SEEK_SPAN)."""

SCAN_COUNT = 2000
"""Fields an HSCAN step returns (stats and seeks of keys that are absent only: never the request path)."""

WATCH_WAIT_S = 0.5
"""The change watcher sleeps at most this long between checks that it should stop (it wakes at once
on a message), and waits this long before subscribing again after an error."""

WATCH_DRAIN = 1000
"""Messages the watcher reads from one node before it turns to the next."""

WRITE_PAIRS = 20_000
"""Fields one HSET of a bulk load carries."""

BULK_PIPELINE = 8
"""HSETs of a bulk load in flight on one pipeline (not a transaction: a version is not served until its
manifest is written, after every row)."""


SCRIPT_PAIRS = 1000
"""Fields one HSET inside the fenced-write script sets (Lua's ``unpack`` has a stack limit)."""

# KEYS[1]: the shard; ARGV: fence key, expected token ('' = none yet), new token, the shard's change
# channel, the batch's row keys (packed; '' = none), then field, value...
FENCED_WRITE = f"""
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  if cur then return redis.error_reply('FENCED') end
elseif cur ~= ARGV[2] then
  return redis.error_reply('FENCED')
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
for i = 6, #ARGV, {2 * SCRIPT_PAIRS} do
  redis.call('HSET', KEYS[1], unpack(ARGV, i, math.min(i + {2 * SCRIPT_PAIRS - 1}, #ARGV)))
end
if ARGV[5] ~= '' then redis.call('SPUBLISH', ARGV[4], ARGV[5]) end
return 1
"""


class StoreFenced(StoreRemoteError):
    """A shard no longer holds what this writer's last batch left there (a failover lost acknowledged
    writes, or another process writes the store): the batch was not written. Restart the writer: it
    then reads the positions the store really holds."""


def shard_key(namespace: str, shard: int) -> bytes:
    """The hash of one shard: ``offgraph:{NAMESPACE/s}`` (the braces: one slot for the whole shard)."""
    return f"offgraph:{{{namespace}/{shard}}}".encode()


def change_channel(namespace: str, shard: int) -> bytes:
    """The sharded pub/sub channel of one shard's written rows, on the shard's own slot."""
    return f"offgraph:{{{namespace}/{shard}}}:rows".encode()


def _redis_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisClusterException, RedisError

    return (RedisError, RedisClusterException, OSError)


def seed_nodes(url: str) -> list[tuple[str, int]]:
    """``redis://H1:P1[,H2:P2...]`` -> ``[(H1, P1), ...]`` (ValueError naming the form otherwise)."""
    scheme, sep, rest = url.partition("://")
    nodes = []
    for part in rest.split(",") if scheme == "redis" and sep else []:
        host, colon, port = part.partition(":")
        if not host or not colon or not port.isdigit() or "/" in part:
            break
        nodes.append((host, int(port)))
    else:
        if nodes:
            return nodes
    raise ValueError(f"a Redis Cluster URL is redis://HOST:PORT[,HOST:PORT...], got {url!r}")


def connect(url: str, timeout_ms: int):
    """A cluster client of the seed nodes of ``url`` (any that answers will do) whose every call is
    bounded by ``timeout_ms`` (one retry after a topology change: a failover's MOVED is followed, a dead
    cluster fails fast)."""
    from redis.backoff import NoBackoff
    from redis.cluster import ClusterNode, RedisCluster
    from redis.retry import Retry

    t = timeout_ms / 1000
    return RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in seed_nodes(url)],
        socket_timeout=t,
        socket_connect_timeout=t,
        retry=Retry(NoBackoff(), 1),
        require_full_coverage=False,  # a shard whose master is down fails alone; the others serve
    )


def cluster_url(url: str, timeout_ms: int = 5000) -> str:
    """``url`` with every node of its cluster as a seed (what a version records: a client then starts
    while any of them answers, not only the one node an export was given)."""
    client = connect(url, timeout_ms)
    try:
        # CLUSTER NODES, replicas included: one of them is the master after a failover
        nodes = sorted({(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in client.cluster_nodes()})
    finally:
        client.close()
    return "redis://" + ",".join(f"{h}:{p}" for h, p in nodes)


class _NodeName(NamedTuple):
    """What ``ClusterPubSub.get_sharded_message(target_node=...)`` reads of a node: its name, the key of
    the node's subscription (a node that left the cluster has none in the client, its subscription
    still has to be drained, or ``_wait_readable`` would wake for it at once, forever)."""

    name: str


def _wait_readable(pubsub, timeout_s: float) -> None:
    """Waits until one of a cluster subscription's node connections has bytes to read, or
    ``timeout_s``. redis-py gives no public wait over several connections, so this polls their
    sockets (``poll``, not ``select``: a serving process's descriptors pass 1024); where one has no
    socket (being reconnected) it waits a short while instead and the next read reconnects it."""
    poller = select.poll()
    for node_pubsub in list(pubsub.node_pubsub_mapping.values()):
        sock = getattr(getattr(node_pubsub, "connection", None), "_sock", None)
        try:
            poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        except (AttributeError, ValueError, OSError):
            time.sleep(min(timeout_s, 0.05))
            return
    poller.poll(timeout_s * 1e3)


def _healthy_replicas(conn) -> int:
    """Replicas of the master ``conn`` talks to that the cluster sees up (no ``fail``/``fail?`` flag, link
    connected): the ones a ``WAIT`` could have heard from."""
    lines = conn.execute_command("CLUSTER", "REPLICAS", conn.execute_command("CLUSTER", "MYID"))
    out = 0
    for line in lines or []:
        parts = (line.decode() if isinstance(line, bytes) else str(line)).split()
        if len(parts) > 7 and "fail" not in parts[2] and parts[7] == "connected":
            out += 1
    return out


def _close_quietly(pubsub) -> None:
    """Closes a subscription that may be broken already: nothing in it is left to save."""
    if pubsub is not None:
        with contextlib.suppress(Exception):
            pubsub.close()


def _unavailable(what: str, url: str, e: BaseException) -> StoreUnavailable:
    return StoreUnavailable(f"redis {what} at {url}: {type(e).__name__}: {e}", "unavailable")


@dataclasses.dataclass(frozen=True)
class _BulkWriterFactory:
    """Picklable ``(shard, path) -> SstWriter`` of a bulk load: each writer sends its shard's rows
    straight to the cluster (``path``, the SST file RocksDB's writers would write, is not used)."""

    url: str
    namespace: str
    timeout_ms: int

    def __call__(self, shard: int, path: str) -> SstWriter:
        return _BulkWriter(connect(self.url, self.timeout_ms), shard_key(self.namespace, shard), self.url)


class _BulkWriter(SstWriter):
    def __init__(self, client, key: bytes, url: str) -> None:
        self.client, self.key, self.url = client, key, url
        self.pipe = client.pipeline(transaction=False)
        self.queued = 0

    def add(self, keys: list[bytes], values: list[bytes]) -> None:
        for i in range(0, len(keys), WRITE_PAIRS):
            self.pipe.hset(self.key, mapping=dict(zip(keys[i : i + WRITE_PAIRS], values[i : i + WRITE_PAIRS])))
            self.queued += 1
            if self.queued >= BULK_PIPELINE:
                self._send()

    def _send(self) -> None:
        try:
            self.pipe.execute()
        except _redis_errors() as e:
            raise OSError(errno.EIO, f"redis bulk write at {self.url}: {type(e).__name__}: {e}") from None
        self.queued = 0

    def finish(self) -> None:
        if self.queued:
            self._send()
        self.client.close()


class RedisBackend(StoreBackend):
    """The ``"redis"`` backend: one hash per shard in a Redis Cluster (``StoreConfig.url``,
    ``StoreConfig.namespace``)."""

    backend = "redis"
    io_mode = "remote"

    def _open(self, **options: Any) -> None:
        config = self.config
        if not config.url or not config.namespace:
            raise ValueError(
                f"store {self.path!r}: the redis backend needs StoreConfig.url (redis://HOST:PORT) and "
                f"namespace, got url={config.url!r}, namespace={config.namespace!r}"
            )
        self.url = config.url
        self._keys = [shard_key(config.namespace, s) for s in range(config.shards)]
        self._channels = [change_channel(config.namespace, s) for s in range(config.shards)]
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._subscription: Any = None  # the watcher's current ClusterPubSub (tests break its connections)
        try:
            self._client = connect(config.url, config.remote_timeout_ms)
        except _redis_errors() as e:
            raise StoreRemoteError(errno.ECONNREFUSED, f"cannot reach the Redis Cluster at {config.url}: {e}") from None
        self._fence: list[bytes] = []  # mode w: the token each shard's fence holds since our last batch
        self._writer = secrets.token_hex(6)
        self._batches = 0
        try:
            if self.mode == "w":
                for k in self._keys:
                    self._client.hsetnx(k, SHARD_CREATED_KEY, b"1")
                self._fence = [self._client.hget(k, WRITE_FENCE_KEY) or b"" for k in self._keys]
                self._script = self._client.register_script(FENCED_WRITE)
            else:
                missing = [s for s, k in enumerate(self._keys) if not self._client.hexists(k, SHARD_CREATED_KEY)]
                if missing:
                    raise ValueError(
                        f"store {self.path!r}: the Redis Cluster at {config.url} holds no shard {missing[0]} of "
                        f"namespace {config.namespace!r} ({len(missing)} of {config.shards} shards missing)"
                    )
        except _redis_errors() as e:
            self._client.close()
            raise StoreRemoteError(errno.EIO, f"store {self.path!r}: Redis Cluster at {config.url}: {e}") from None
        except BaseException:
            self._client.close()
            raise

    def _close(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(5)
        self._client.close()

    def watch_changes(self, on_rows, on_lost) -> bool:
        """Every batch a writer applies is published, in the same script, on its shard's sharded
        pub/sub channel (its row keys): a reader on any machine calls ``on_rows`` with them (its row
        cache drops them). Pub/sub is at most once, so whenever the subscription may have missed a
        message ``on_lost`` is called and the reader forgets every cached row: after a lost
        connection, and after any subscription confirmed past the first ones (redis-py reconnects a
        dropped subscription by itself and subscribes again, a gap it does not report otherwise)."""
        pubsub = self._client.pubsub()
        try:
            pubsub.ssubscribe(*self._channels)
        except _redis_errors() as e:
            pubsub.close()
            raise StoreRemoteError(errno.EIO, f"redis subscribe at {self.url}: {e}") from None
        self._watcher = threading.Thread(
            target=self._watch, args=(pubsub, on_rows, on_lost), name="offgraph-redis-watch", daemon=True
        )
        self._watcher.start()
        return True

    def _watch(self, pubsub, on_rows, on_lost) -> None:
        expected = len(set(self._channels))  # the confirmations of one subscription
        confirmed = 0
        self._subscription = pubsub
        while not self._watch_stop.is_set():
            try:
                if pubsub is None:
                    pubsub, confirmed = self._client.pubsub(), 0
                    pubsub.ssubscribe(*self._channels)
                    self._subscription = pubsub
                    on_lost()  # what was published while unsubscribed is not known
                got = gap = False
                for m in self._pending_messages(pubsub):
                    got = True
                    kind = m.get("type")
                    if kind in ("ssubscribe", b"ssubscribe"):
                        confirmed += 1
                        gap |= confirmed > expected  # subscribed again: a gap in the stream
                    elif kind in ("smessage", b"smessage") and m.get("data"):
                        keys = np.frombuffer(m["data"], dtype=KEY_DTYPE)
                        on_rows(keys["table"].astype(np.int64), keys["row"].astype(np.int64))
                if gap:
                    on_lost()
                if not got:
                    _wait_readable(pubsub, WATCH_WAIT_S)
            except Exception as e:  # noqa: BLE001 (the watcher must outlive any error: a dead one leaves stale rows)
                level = logging.DEBUG if isinstance(e, _redis_errors()) else logging.WARNING
                log.log(level, "redis change stream of %s: %r; subscribing again", self.path, e)
                on_lost()
                _close_quietly(pubsub)
                pubsub = None
                self._watch_stop.wait(WATCH_WAIT_S)
                self._refresh_topology()
        _close_quietly(pubsub)

    def _refresh_topology(self) -> None:
        """Reads the cluster's slot map again. A subscription goes to each channel's master as the
        client's map has it, and only commands refresh that map: a process whose store is read by
        nobody else (or not yet) would subscribe to a dead master again and again after a failover."""
        try:
            self._client.nodes_manager.initialize()
        except Exception as e:  # noqa: BLE001 (the cluster still down: the next try refreshes again)
            log.debug("redis slot map of %s not refreshed: %r", self.path, e)

    def _pending_messages(self, pubsub) -> Iterator[dict]:
        """Every message the node subscriptions hold now, none of the reads waiting. (redis-py's own
        ``get_sharded_message(timeout=t)`` visits the nodes in turn and waits up to ``t`` on each:
        a message on one node would sit behind the other nodes' quiet connections.)"""
        for name in list(pubsub.node_pubsub_mapping):
            node = _NodeName(name)  # every subscription is drained, its node still in the cluster or not
            for _ in range(WATCH_DRAIN):
                m = pubsub.get_sharded_message(timeout=0.0, target_node=node)
                if m is None:
                    break
                yield m

    # ------------------------------------------------------------------ reads
    def _multi_get(self, shard: int, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            return self._client.hmget(self._keys[shard], keys)
        except _redis_errors() as e:
            raise _unavailable(f"read of shard {shard}", self.url, e) from e

    def _scan(self, shard: int) -> Iterator[tuple[bytes, bytes]]:
        try:
            yield from self._client.hscan_iter(self._keys[shard], count=SCAN_COUNT)
        except _redis_errors() as e:
            raise _unavailable(f"scan of shard {shard}", self.url, e) from e

    def _seek_first(self, shard: int, lowers: list[bytes]) -> list[tuple[bytes, bytes] | None]:
        """A hash keeps no order, but the shard function says which rows a shard holds: for a row key
        ``(t, r)`` the answer is the first of ``(t, r), (t, r + 1), ...`` that hashes to this shard and
        is stored, so the next ``SEEK_SPAN`` rows' keys of this shard are read in one HMGET for all the
        lowers (None past them: past a table's last row). A meta key's seek scans the shard."""
        rows_part = [i for i, k in enumerate(lowers) if len(k) == KEY_BYTES and k < META_PREFIX]
        out: list[tuple[bytes, bytes] | None] = [None] * len(lowers)
        if rows_part:
            t, r = decode_keys([lowers[i] for i in rows_part])
            span = np.arange(SEEK_SPAN * self.config.shards, dtype=np.uint64)
            ct = np.repeat(t.astype(np.int64), len(span))
            cr = (r[:, None] + span[None, :]).ravel()
            mine = shard_of(ct, cr.astype(np.int64), self.config.shards) == shard
            owner = np.repeat(np.arange(len(rows_part)), len(span))[mine]
            cand = encode_keys(ct[mine], cr[mine].astype(np.int64))
            values = self._multi_get(shard, cand)
            for o, k, v in zip(owner.tolist(), cand, values):
                i = rows_part[o]
                if v is not None and out[i] is None:
                    out[i] = (k, v)
        taken = set(rows_part)
        meta_part = [i for i in range(len(lowers)) if i not in taken]
        if meta_part:
            ordered = sorted(self._scan(shard))
            keys = [k for k, _ in ordered]
            for i in meta_part:
                j = bisect.bisect_left(keys, lowers[i])
                out[i] = ordered[j] if j < len(ordered) else None
        return out

    def _iter_row_keys(self, shard: int) -> Iterable[bytes]:
        return sorted(k for k, _ in self._scan(shard) if k < META_PREFIX)

    def _iter_values(self, shard: int, lower: bytes, upper: bytes) -> Iterable[bytes]:
        return [v for _, v in sorted((k, v) for k, v in self._scan(shard) if lower <= k < upper)]

    # ------------------------------------------------------------------ writes
    def _write_batch(self, shard: int, keys: list[bytes], values: list[bytes], sync: bool, wal: bool = True) -> None:
        """One script on the shard's slot: every record of the batch, or none, and only on the state
        this writer's previous batch left (the fence; :class:`StoreFenced` otherwise), confirmed by one
        replica (``_write_durably``). ``sync`` and ``wal`` are the cluster's own business (its AOF): what a
        failover still loses, it loses with the source positions written in the same batch, and the fence
        tells the writer so."""
        if not keys:
            return
        pairs = dict(zip(keys, values))  # a repeated key: the last one wins
        self._batches += 1
        token = f"{self._writer}:{self._batches}".encode()
        rows = b"".join(k for k in pairs if len(k) == KEY_BYTES and k < META_PREFIX)
        args: list[bytes] = [WRITE_FENCE_KEY, self._fence[shard], token, self._channels[shard], rows]
        args.extend(itertools.chain.from_iterable(pairs.items()))  # field, value, ... (no loop in Python)
        try:
            self._write_durably(shard, args)
        except StoreRemoteError:  # (an OSError: said in full already)
            raise
        except _redis_errors() as e:
            if "FENCED" in str(e):
                raise StoreFenced(
                    errno.ESTALE,
                    f"redis shard {shard} at {self.url} no longer holds this writer's last batch (a failover "
                    "lost acknowledged writes, or another process writes this store): restart to replay "
                    "from the positions it holds",
                ) from None
            raise StoreRemoteError(
                errno.EIO, f"redis write of shard {shard} at {self.url}: {type(e).__name__}: {e}"
            ) from None
        self._fence[shard] = token

    def _write_durably(self, shard: int, args: list[bytes]) -> None:
        """The fenced script on the shard's master, then ``WAIT`` for one replica on the same connection
        (WAIT counts the writes of its own connection): Redis replicates asynchronously, so a write the
        master acknowledged and a failover then lost would be lost for good where the source forgets what
        it acknowledged (the spool deletes an applied file). A replica that does not confirm within
        half the store's ``remote_timeout_ms`` (the socket's timeout bounds the wait) makes the batch a
        failed write: the updater reopens and writes it again (rows keep their seqs, so again is harmless).
        A master with no replica the cluster sees up cannot have one confirm: its write goes on once WAIT has
        sat out its time, as durable as that master (a degraded cluster's writes are slower, not refused)."""
        from redis.exceptions import ConnectionError, ResponseError, TimeoutError  # noqa: A004 (redis's own)

        key, wait_ms = self._keys[shard], max(1, self.config.remote_timeout_ms // 2)
        for attempt in (1, 2):
            node = self._client.get_node_from_key(key)
            conn = self._client.get_redis_connection(node)
            pipe = conn.pipeline(transaction=False)
            self._script(keys=[key], args=args, client=pipe)
            pipe.execute_command("WAIT", 1, wait_ms)
            try:
                _, confirmed = pipe.execute()
                break
            except (ConnectionError, TimeoutError, ResponseError) as e:
                # straight to a node, this write bypasses the cluster client's own recovery: a dead master
                # (failover) or a moved slot refreshes the map once and tries the new master
                if attempt == 2 or "FENCED" in str(e):
                    raise
                self._client.nodes_manager.initialize()
        if int(confirmed) < 1 and _healthy_replicas(conn):
            raise StoreRemoteError(
                errno.EIO,
                f"redis write of shard {shard} at {self.url}: no replica confirmed it within {wait_ms} ms "
                "(written again after a reopen)",
            )

    def _flush(self, shard: int) -> None:
        """Nothing to do: a write is in the cluster when it returns."""

    def _sst_writer_factory(self):
        return _BulkWriterFactory(self.url, self.config.namespace or "", self.config.remote_timeout_ms)

    def _ingest(self, shard: int, paths: list[str]) -> None:
        """The bulk writers wrote the rows already; their ``paths`` were never created."""
        for p in paths:
            if os.path.exists(p):
                os.unlink(p)

    def _catch_up(self, shard: int) -> None:
        """Nothing to do: every read asks the cluster, which holds the writer's rows once written."""

    # ------------------------------------------------------------------ stats
    def _shard_info(self, shard: int) -> dict[str, Any]:
        try:
            n = int(self._client.hlen(self._keys[shard]))
            used = self._client.memory_usage(self._keys[shard], samples=5) or 0
        except _redis_errors() as e:
            raise _unavailable(f"stats of shard {shard}", self.url, e) from e
        return {"bytes_on_disk": 0, "estimated_keys": n, "cluster_bytes": int(used)}

    def cache_usage(self) -> int:
        return 0

    def set_cache_mb(self, mb: int) -> None:
        """No cache of its own to bound."""

    def block_cache_stats(self) -> dict[str, int] | None:
        return None

    @classmethod
    def data_files(cls, store_dir: str | os.PathLike) -> list[Path]:
        return []

    @classmethod
    def reads_direct(cls, store_dir: str | os.PathLike, config: StoreConfig) -> bool:
        """No local file is read: the page cache has nothing to hold for it."""
        return True

    # backend-specific
    def delete_rows(self, pause_s: float = 0.05) -> int:
        """Delete every key of this store from the cluster (an old version's clean-up): a shard at a
        time with UNLINK (the memory is freed in the cluster's background thread: no master blocks on a
        big hash), ``pause_s`` between shards. Returns the shards deleted."""
        try:
            for i, k in enumerate(self._keys):
                if i and pause_s > 0:
                    self._watch_stop.wait(pause_s)
                self._client.unlink(k)
        except _redis_errors() as e:
            raise _unavailable("delete", self.url, e) from e
        return len(self._keys)
