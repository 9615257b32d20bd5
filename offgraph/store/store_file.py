"""``store.json``: the StoreConfig a store was created with, inside the store directory."""

from __future__ import annotations

import json
import os
from typing import Any

from offgraph.store.config import StoreConfig
from offgraph.store.quant import get_codec

STORE_FILE = "store.json"
FORMAT = "offgraph-embstore"  # stores written by every release carry this name: never rename it
FORMAT_VERSION = 1


def store_file(path: str) -> str:
    return os.path.join(path, STORE_FILE)


def read_store_file(path: str) -> StoreConfig | None:
    """The stored config, or None if ``path`` has no ``store.json``."""
    f = store_file(path)
    if not os.path.exists(f):
        return None
    with open(f, encoding="utf-8") as fh:
        doc = json.load(fh)
    if doc.get("format") != FORMAT:
        raise ValueError(f"{f!r} is not an {FORMAT} file (format={doc.get('format')!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{f!r} has format_version {doc.get('format_version')!r}; this code reads {FORMAT_VERSION}")
    return StoreConfig.from_dict(doc["config"])


def write_store_file(path: str, config: StoreConfig) -> None:
    """Write ``store.json`` atomically (temp file + rename)."""
    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "record": get_codec(config.quant, config.dim).describe(),
    }
    f = store_file(path)
    tmp = f + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, f)
