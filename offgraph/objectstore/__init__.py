"""Object storage for model versions: one interface (``base.ObjectStore``), one module per provider
(``s3.py``), the provider picked by the URI's scheme; a scheme no provider implements is refused naming
it. Whole-tree transfers (resumable upload, verified parallel download) are in ``transfer.py``.

    store = open_store("s3://bucket/models")     # endpoint and credentials: the AWS variables and files
    store.list(store.location.key("ml/"))
"""

from __future__ import annotations

import importlib

from offgraph.objectstore.base import (
    PROVIDERS,
    Location,
    ObjectInfo,
    ObjectStore,
    ObjectStoreError,
    UnsupportedScheme,
    check_scheme,
    scheme_of,
)

__all__ = [
    "Location",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStoreError",
    "UnsupportedScheme",
    "check_scheme",
    "open_store",
    "scheme_of",
]


def open_store(uri: str) -> ObjectStore:
    """The store of ``uri``'s bucket (``store.location``: the parsed URI); UnsupportedScheme names a scheme
    no provider implements."""
    location = Location.parse(uri)
    module = importlib.import_module(PROVIDERS[location.scheme])
    return module.store_for(location)
