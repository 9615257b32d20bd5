"""``open_store``: create or open a store directory: an ``EmbeddingStore`` holding the backend its
``store.json`` names (``BACKENDS``)."""

from __future__ import annotations

import os

from offgraph.store.backend import StoreBackend
from offgraph.store.base import MODES, EmbeddingStore
from offgraph.store.config import StoreConfig
from offgraph.store.redis_store import RedisBackend
from offgraph.store.rocksdb_store import RocksDBBackend
from offgraph.store.store_file import STORE_FILE, read_store_file, write_store_file

BACKENDS: dict[str, type[StoreBackend]] = {RocksDBBackend.backend: RocksDBBackend, RedisBackend.backend: RedisBackend}
"""The backends by ``StoreConfig.backend`` (a ``store.json`` that names none means ``"rocksdb"``)."""


def backend_class(name: str) -> type[StoreBackend]:
    """The backend ``StoreConfig.backend`` names (ValueError for an unknown name)."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {sorted(BACKENDS)!r}") from None


def backend_location(uri: str) -> dict[str, str]:
    """The ``StoreConfig`` settings of a backend URI: ``"rocksdb"`` (local files, the default) ->
    ``{"backend": "rocksdb"}``; ``"redis://HOST:PORT[,HOST:PORT...]"`` (nodes of a Redis Cluster) ->
    ``{"backend": "redis", "url": ...}``. ValueError naming the forms otherwise."""
    from offgraph.store.redis_store import seed_nodes

    if uri == RocksDBBackend.backend:
        return {"backend": RocksDBBackend.backend}
    try:
        seed_nodes(uri)
    except ValueError:
        raise ValueError(
            f"backend must be 'rocksdb' or 'redis://HOST:PORT' (nodes of a Redis Cluster), got {uri!r}"
        ) from None
    return {"backend": RedisBackend.backend, "url": uri}


def store_backend(path: str | os.PathLike) -> type[StoreBackend]:
    """The backend of the store directory ``path``, without opening it (the default backend where
    ``path`` has no ``store.json``)."""
    stored = read_store_file(os.fspath(path))
    return backend_class(stored.backend if stored is not None else StoreConfig.model_fields["backend"].default)


def open_store(
    path: str | os.PathLike,
    config: StoreConfig | None = None,
    mode: str = "r",
    *,
    secondary_dir: str | None = None,
) -> EmbeddingStore:
    """Open the store at ``path``.

    mode ``"w"``: read-write; creates the store (and its ``store.json``) when absent,
        which needs ``config``. ``"r"``: read-only. ``"follow"``: a follower of a live
        writer process (call ``catch_up()`` periodically); ``secondary_dir`` holds its
        private files (a temporary directory by default).
    ``config`` may be omitted to use the stored one; if given, its layout (dim, quant,
    shards, shard_fn, key_format, backend) must equal the stored one (ValueError
    otherwise), and its tuning settings (cache, bloom bits, threads...) are used.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if config is not None and not isinstance(config, StoreConfig):
        raise ValueError(f"config must be a StoreConfig, got {type(config).__name__}")
    path = os.fspath(path)
    stored = read_store_file(path) if os.path.isdir(path) else None
    if stored is None:
        if mode != "w":
            raise ValueError(f"{path!r} is not an embedding store (no {STORE_FILE})")
        if config is None:
            raise ValueError(f"creating a store at {path!r} needs a StoreConfig")
        backend_class(config.backend)
        if os.path.isdir(path) and os.listdir(path):
            raise ValueError(f"{path!r} exists, is not empty and has no {STORE_FILE}")
        os.makedirs(path, exist_ok=True)
        write_store_file(path, config)
        effective = config
    else:
        if config is not None:
            stored.check_same_layout(config)
        effective = config or stored
    kwargs = {"secondary_dir": secondary_dir} if mode == "follow" else {}
    return EmbeddingStore(path, effective, mode, backend_class(effective.backend), **kwargs)


def delete_remote_rows(path: str | os.PathLike, config: StoreConfig | None = None, pause_s: float = 0.05) -> bool:
    """Delete the rows a remote backend holds for the store at ``path`` (``config``: the settings to open
    it with; default the stored ones), a shard at a time with ``pause_s`` between them. False, and nothing
    done, for a local backend: its rows are the directory's files."""
    cls = backend_class(config.backend) if config is not None else store_backend(path)
    if not issubclass(cls, RedisBackend):
        return False
    with open_store(path, config, mode="w") as st:
        assert isinstance(st.storage, RedisBackend)
        st.storage.delete_rows(pause_s)
    return True
