"""What offgraph asks of an object store, whatever the provider: list, head, ranged reads, whole-file
writes (multipart, parallel parts, bounded memory), small writes and deletes; and the URI rule that
picks a provider by scheme.

Keys are relative to the store's root (the URI's bucket); a provider module (``s3.py``) implements
:class:`ObjectStore` and registers its schemes in ``PROVIDERS`` (``offgraph.objectstore.open_store``).
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

PROVIDERS = {"s3": "offgraph.objectstore.s3"}
"""Scheme -> the module implementing it (imported when a URI names it)."""


class ObjectStoreError(OSError):
    """An object store refused or failed a request; the message names the URI or key."""


class UnsupportedScheme(ValueError):
    """A path names a scheme offgraph does not read or write: refused, never taken as a local folder."""


def scheme_of(path: str) -> str | None:
    """The URI scheme ``path`` names (``s3`` of ``s3://b/p``), lower case; None for a local path."""
    m = _SCHEME_RE.match(str(path))
    return m.group(1).lower() if m else None


def check_scheme(path: str) -> str | None:
    """``scheme_of(path)``, or UnsupportedScheme naming the scheme when no provider implements it."""
    scheme = scheme_of(path)
    if scheme is not None and scheme not in PROVIDERS:
        raise UnsupportedScheme(
            f"{path}: unsupported scheme '{scheme}://'; offgraph reads and writes "
            f"{', '.join(s + '://' for s in sorted(PROVIDERS))} (S3 API) or a local path"
        )
    return scheme


@dataclass(frozen=True)
class Location:
    """A parsed URI: ``scheme://bucket/prefix`` (prefix without leading or trailing '/')."""

    scheme: str
    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str) -> Location:
        scheme = check_scheme(uri)
        if scheme is None:
            raise UnsupportedScheme(f"{uri}: not a URI (scheme://bucket/prefix)")
        rest = str(uri)[len(scheme) + 3 :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise ValueError(f"{uri}: no bucket (expected {scheme}://BUCKET/PREFIX)")
        return cls(scheme, bucket, prefix.strip("/"))

    def key(self, *parts: str) -> str:
        """The key of ``parts`` under the prefix."""
        return "/".join(p.strip("/") for p in (self.prefix, *parts) if p.strip("/"))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str | None = None


class ObjectStore(ABC):
    """One bucket of a provider. Implementations are thread-safe: the transfers call them from pools."""

    location: Location

    @abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursively), in key order."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object's size and ETag; None when there is none."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes | memoryview:
        """Bytes ``[start, start + length)`` of an object."""

    async def get_range_async(self, key: str, start: int, length: int) -> bytes | memoryview:
        """``get_range`` for an event loop (a provider with a native async client overrides it)."""
        import asyncio

        return await asyncio.to_thread(self.get_range, key, start, length)

    @abstractmethod
    def put_file(self, key: str, path: Path, *, part_bytes: int, concurrency: int) -> ObjectInfo:
        """Write a local file as one object, atomically (a reader sees all of it or none): a multipart
        upload of ``part_bytes`` parts, ``concurrency`` at once (memory: their product) above one part."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> ObjectInfo:
        """Write a small object at once."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object (no error when there is none)."""
