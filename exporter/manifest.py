"""manifest.json of a model version: what it holds, and how to tell a complete version.

A version directory is complete only when its manifest is in place; the
exporter writes everything else first and the manifest last by atomic rename.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from features.spec import FG_VERSION

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
DENSE_DIR = "dense"
STORE_DIR = "store"
_VERSION_RE = re.compile(r"^[0-9]{1,18}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ModelDirError(ValueError):
    """A model directory or version that must not be served; the message says why."""


def check_model_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name) or ".." in name:
        raise ModelDirError(f"invalid model name {name!r}: letters, digits, '.', '_' and '-' only")
    return name


def complete_versions(model_dir: str | Path) -> list[int]:
    """Versions (integer directory names) of a model that have a manifest, ascending."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    out = []
    for p in model_dir.iterdir():
        if p.is_dir() and _VERSION_RE.match(p.name) and (p / MANIFEST).is_file():
            out.append(int(p.name))
    return sorted(out)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tree_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by path relative to root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = file_sha256(p)
    return dict(sorted(out.items()))


def digest(checksums: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(checksums, sort_keys=True).encode()).hexdigest()


def write_manifest(version_dir: Path, manifest: dict[str, Any]) -> Path:
    tmp = version_dir / (MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=2, sort_keys=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, version_dir / MANIFEST)
    dfd = os.open(version_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return version_dir / MANIFEST


def load_manifest(version_dir: str | Path, verify_dense: bool = True) -> dict[str, Any]:
    """Read and check a version's manifest; ModelDirError says what is wrong."""
    version_dir = Path(version_dir)
    path = version_dir / MANIFEST
    if not path.is_file():
        raise ModelDirError(f"{version_dir}: no {MANIFEST}: the version is incomplete (an export in progress "
                            "or interrupted), not loadable")
    try:
        m = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{path}: unreadable manifest: {e}") from None
    if not isinstance(m, dict):
        raise ModelDirError(f"{path}: manifest is not a JSON object")
    if m.get("format_version") != FORMAT_VERSION:
        raise ModelDirError(f"{path}: format_version {m.get('format_version')!r}, this offgraph reads {FORMAT_VERSION}")
    if m.get("fg_version") != FG_VERSION:
        raise ModelDirError(f"{path}: FG version {m.get('fg_version')!r} differs from this offgraph's {FG_VERSION!r}: "
                            "its rows would be looked up with different hashing")
    for key in ("spec", "fields", "embedding_dim", "store", "checksums"):
        if key not in m:
            raise ModelDirError(f"{path}: manifest lacks '{key}'")
    dense = version_dir / DENSE_DIR
    if not dense.is_dir():
        raise ModelDirError(f"{version_dir}: missing {DENSE_DIR}/")
    if verify_dense:
        got = tree_checksums(dense)
        want = m["checksums"].get("dense", {})
        if got != want:
            changed = sorted(set(got.items()) ^ set(want.items()))
            raise ModelDirError(f"{version_dir}: dense model checksum mismatch ({changed[0][0]} and "
                                f"{len(changed) - 1} more differ)")
    store = version_dir / STORE_DIR
    for s in range(int(m["store"]["shards"])):
        if not (store / f"shard-{s:03d}").is_dir():
            raise ModelDirError(f"{version_dir}: missing store shard {s} ({STORE_DIR}/shard-{s:03d})")
    return m
