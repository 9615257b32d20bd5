"""Errors of the embedding store's backend."""

from __future__ import annotations


class StoreReadError(RuntimeError):
    """The backend failed to read rows that should be readable: a corrupt or missing file, an I/O
    error. The message carries the backend's own detail (file paths included): log it, do not show
    it to clients. ``kind`` is a short, path-free summary (e.g. ``Corruption``)."""

    def __init__(self, message: str, kind: str = "read error"):
        super().__init__(message)
        self.kind = kind


class StoreUnavailable(StoreReadError):
    """A remote backend did not answer in its timeout (a cluster down, a failover under way): nothing
    is wrong with the store, so the version stays healthy and a retry may succeed (the server answers
    503 with Retry-After, and serves again by itself once the backend answers)."""

    def __init__(self, message: str, kind: str = "unavailable"):
        super().__init__(message, kind)


class StoreRemoteError(OSError):
    """A remote backend's write or open did not go through: the cluster did not answer (down, failing
    over), or a shard changed under the writer (:class:`~offgraph.store.redis_store.StoreFenced`).
    Nothing of the failed batch was applied, and the store is not at fault: a writer reopens it and goes
    on from the positions it holds (the updater does, with a backoff), where a local disk error stops it."""
