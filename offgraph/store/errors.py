"""Errors of the embedding store's backend."""

from __future__ import annotations


class StoreReadError(RuntimeError):
    """The backend failed to read rows that should be readable: a corrupt or missing file, an I/O
    error. The message carries the backend's own detail (file paths included): log it, do not show
    it to clients. ``kind`` is a short, path-free summary (e.g. ``Corruption``)."""

    def __init__(self, message: str, kind: str = "read error"):
        super().__init__(message)
        self.kind = kind
