"""manifest.json of a model version: what it holds, and how to tell a complete version.

A version directory is complete only when its manifest is in place; the
exporter writes everything else first and the manifest last by atomic rename.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import xxhash
from pydantic import ValidationError

from offgraph.features.spec import FG_VERSION
from offgraph.modeldir.layout import LOSSES, SIGNATURE  # noqa: F401 (SIGNATURE: the version's names, here too)
from offgraph.modeldir.manifest_model import Manifest, store_record

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
DENSE_DIR = "dense"
STORE_DIR = "store"
_VERSION_RE = re.compile(r"[0-9]{1,18}")  # fullmatch: '$' would also match before a trailing newline
MODEL_NAME_PATTERN = r"^[A-Za-z0-9](\.?[A-Za-z0-9_-])*\.?$"
"""THE model name rule, also published as the OpenAPI pattern (``offgraph.server.api.deps``): letters, digits, '.', '_' and
'-', starting with a letter or digit, no '..'; so no whitespace, control character or path separator."""
MODEL_NAME_MAX = 128
MODEL_NAME_RULE = (
    f"1 to {MODEL_NAME_MAX} letters, digits, '.', '_' and '-', starting with a letter or digit, "
    "without '..' (no whitespace or control characters)"
)
_NAME_RE = re.compile(MODEL_NAME_PATTERN)


class ModelDirError(ValueError):
    """A model directory or version that must not be served; the message says why."""


def check_model_name(name: str) -> str:
    # fullmatch, not match: the pattern's '$' matches before a trailing newline ('movielens\n')
    if not isinstance(name, str) or len(name) > MODEL_NAME_MAX or not _NAME_RE.fullmatch(name):
        raise ModelDirError(f"invalid model name {name!r}: a model name is {MODEL_NAME_RULE}")
    return name


def complete_versions(model_dir: str | Path) -> list[int]:
    """Versions (integer directory names) of a model that have a manifest, ascending."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return []
    out = []
    for p in model_dir.iterdir():
        if p.is_dir() and _VERSION_RE.fullmatch(p.name) and (p / MANIFEST).is_file():
            out.append(int(p.name))
    return sorted(out)


def check_version_dir(out: Path) -> None:
    """``out`` must be MODELS/NAME/VERSION and not a complete version (versions are immutable)."""
    if not out.name.isdigit():
        raise ValueError(f"--out must end in an integer version directory (MODELS/NAME/VERSION), got {out}")
    if (out / MANIFEST).exists():
        raise ValueError(f"{out} is already a complete version; versions are immutable, export to a new one")


def _file_digest(path: Path, h: Any) -> str:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return _file_digest(path, hashlib.sha256())


def file_xxh3(path: Path) -> str:
    return _file_digest(path, xxhash.xxh3_128())


def tree_checksums(root: Path) -> dict[str, str]:
    """sha256 of every file under root, by path relative to root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in sorted(files):
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = file_sha256(p)
    return dict(sorted(out.items()))


FINGERPRINT_EDGE_BYTES = 64 << 10
"""An immutable store file's sha256 covers all of it up to twice this size, else its first and last
this many bytes (an SST's head data blocks and its tail: index, filter, properties, footer)."""
PREFIX_HASH_BYTES = 1 << 20
"""An append-only file (RocksDB's MANIFEST) is checked on its first ``min(size, this)`` bytes."""


def version_file_records(version_dir: Path) -> dict[str, dict[str, Any]]:
    """Every file of a version but its manifest (path relative to ``version_dir``): its size and whole
    xxh3-128, recorded at export so that a copy of the version (``offgraph.modeldir.remote``) can be checked
    file by file. xxh3, not sha256: the copy hashes every byte it downloads, and at ~14 GiB/s against sha256's
    ~1.1 (one core here) the check costs a copy-down 3 % of its time instead of a third; catching a damaged
    or half-copied file needs no cryptographic hash (the manifest beside it comes from the same bucket)."""
    out = {}
    for dirpath, _, files in os.walk(version_dir):
        for name in sorted(files):
            p = Path(dirpath) / name
            rel = str(p.relative_to(version_dir))
            if rel not in (MANIFEST, MANIFEST + ".tmp"):
                out[rel] = {"bytes": p.stat().st_size, "xxh3_128": file_xxh3(p)}
    return dict(sorted(out.items()))


def _store_file_kind(name: str) -> str | None:
    """How a store file may change after export: "immutable", "append-only" (RocksDB's MANIFEST),
    or None: rewritten or removed by a live writer (WAL, CURRENT, LOG, LOCK, the write feed), not checked."""
    if name.endswith(".sst") or name.startswith("OPTIONS-") or name in ("IDENTITY", "store.json"):
        return "immutable"
    if name.startswith("MANIFEST-"):
        return "append-only"
    return None


def _sha256_ranges(path: Path, ranges: list[tuple[int, int]]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for start, n in ranges:
            f.seek(start)
            while n > 0:
                block = f.read(min(n, 1 << 20))
                if not block:
                    break
                h.update(block)
                n -= len(block)
    return h.hexdigest()


def _fingerprint(path: Path, kind: str, size: int, hashed_bytes: int | None = None) -> str:
    if kind == "append-only":
        return _sha256_ranges(path, [(0, size if hashed_bytes is None else hashed_bytes)])
    edge = FINGERPRINT_EDGE_BYTES
    if size <= 2 * edge:
        return _sha256_ranges(path, [(0, size)])
    return _sha256_ranges(path, [(0, edge), (size - edge, edge)])


def store_file_records(store_dir: Path) -> dict[str, dict[str, Any]]:
    """Per checked file of a store (path relative to ``store_dir``): its size and a bounded sha256
    (``verify_store_files`` says what is compared)."""
    out = {}
    for dirpath, dirs, files in os.walk(store_dir):
        dirs[:] = sorted(d for d in dirs if d != "feed")
        for name in sorted(files):
            kind = _store_file_kind(name)
            if kind is None:
                continue
            p = Path(dirpath) / name
            size = p.stat().st_size
            rec: dict[str, Any] = {"kind": kind, "bytes": size}
            if kind == "append-only":
                rec["hashed_bytes"] = min(size, PREFIX_HASH_BYTES)
            rec["sha256"] = _fingerprint(p, kind, size, rec.get("hashed_bytes"))
            out[str(p.relative_to(store_dir))] = rec
    return out


def verify_store_files(version_dir: Path, manifest: Manifest) -> int:
    """Compare the store's files with ``manifest.checksums.store_files`` (recorded at export);
    ModelDirError names the first file that differs. Returns the number of files compared.

    An immutable file (SST, OPTIONS, IDENTITY, store.json) that is present must have its recorded size
    and sha256 (all of a small file; the first and last 64 KiB of a big one); an append-only MANIFEST
    that is present must start with its recorded bytes. A recorded SST, OPTIONS or MANIFEST file that is
    gone is accepted (a live writer compacts and reopens; RocksDB itself refuses to open a shard whose
    MANIFEST lists a missing SST), store.json is not. Files the export did not write are not compared.
    A manifest without the record (older exports) compares nothing.
    """
    records = manifest.checksums.store_files
    if records is None:
        return 0
    store = version_dir / STORE_DIR
    compared = 0
    for rel, rec in records.items():
        p = store / rel
        try:
            size = p.stat().st_size
        except FileNotFoundError:
            if Path(rel).name == "store.json":
                raise ModelDirError(f"{version_dir}: {STORE_DIR}/{rel} is missing") from None
            continue
        kind, want = rec.kind, rec.bytes
        if kind == "append-only":
            hashed = want if rec.hashed_bytes is None else rec.hashed_bytes
            if size < hashed:
                raise ModelDirError(
                    f"{version_dir}: {STORE_DIR}/{rel} is {size} bytes, shorter than the {hashed} "
                    "bytes it had at export: truncated"
                )
            got = _fingerprint(p, kind, size, hashed)
        else:
            if size != want:
                raise ModelDirError(
                    f"{version_dir}: {STORE_DIR}/{rel} is {size} bytes, {want} at export: "
                    "truncated, overwritten or incompletely copied"
                )
            got = _fingerprint(p, "immutable", size)
        if got != rec.sha256:
            raise ModelDirError(
                f"{version_dir}: {STORE_DIR}/{rel} differs from the file exported (sha256 of "
                f"{'its first bytes' if kind == 'append-only' else 'its head and tail'}): "
                "corrupt or replaced"
            )
        compared += 1
    return compared


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


def load_manifest(version_dir: str | Path, verify_dense: bool = True, verify_store: bool | None = None) -> Manifest:
    """Read and check a version's manifest; ModelDirError says what is wrong. ``verify_dense``: compare
    dense/ with its checksums; ``verify_store`` (default: as ``verify_dense``): compare the store's
    files with their export-time records (``verify_store_files``)."""
    version_dir = Path(version_dir)
    path = version_dir / MANIFEST
    if not path.is_file():
        raise ModelDirError(
            f"{version_dir}: no {MANIFEST}: the version is incomplete (an export in progress "
            "or interrupted), not loadable"
        )
    try:
        text = path.read_text()
        m = json.loads(text)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{path}: unreadable manifest: {e}") from None
    if not isinstance(m, dict):
        raise ModelDirError(f"{path}: manifest is not a JSON object")
    if m.get("format_version") != FORMAT_VERSION:
        raise ModelDirError(f"{path}: format_version {m.get('format_version')!r}, this offgraph reads {FORMAT_VERSION}")
    if m.get("fg_version") != FG_VERSION:
        raise ModelDirError(
            f"{path}: FG version {m.get('fg_version')!r} differs from this offgraph's {FG_VERSION!r}: "
            "its rows would be looked up with different hashing"
        )
    # the required keys, in the order a missing one is reported (the model's own order is the file's)
    for key in ("spec", "fields", "embedding_dim", "store", "checksums"):
        if key not in m:
            raise ModelDirError(f"{path}: manifest lacks '{key}'")
    try:
        manifest = Manifest.from_json(text)
    except ValidationError as e:
        raise ModelDirError(f"{path}: {_first_error(e)}") from None
    dense = version_dir / DENSE_DIR
    if not dense.is_dir():
        raise ModelDirError(f"{version_dir}: missing {DENSE_DIR}/")
    if verify_dense:
        got = tree_checksums(dense)
        want = manifest.checksums.dense
        if got != want:
            changed = sorted(set(got.items()) ^ set(want.items()))
            raise ModelDirError(
                f"{version_dir}: dense model checksum mismatch ({changed[0][0]} and {len(changed) - 1} more differ)"
            )
    store = version_dir / STORE_DIR
    local_shards = manifest.store.backend == "rocksdb"  # a remote backend's rows are not in the directory
    for s in range(manifest.store.shards if local_shards else 0):
        if not (store / f"shard-{s:03d}").is_dir():
            raise ModelDirError(f"{version_dir}: missing store shard {s} ({STORE_DIR}/shard-{s:03d})")
    if verify_dense if verify_store is None else verify_store:
        verify_store_files(version_dir, manifest)
    return manifest


def _first_error(e: ValidationError) -> str:
    """The first of pydantic's errors, worded as the manifest checks word theirs."""
    err = e.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    if err["type"] == "missing":
        return f"manifest lacks '{where}'"
    return f"manifest's '{where}' is {err['input']!r}: {err['msg'].lower()}"


def open_version_store(
    version_dir: str | Path,
    manifest: Manifest | Mapping[str, Any],
    mode: str,
    *,
    block_cache_mb: int | None = None,
    statistics: bool = False,
    direct_reads: bool | None = None,
):
    """The store of a model version, opened with the store settings its manifest records
    (``mode``: ``"r"``, ``"w"`` or ``"follow"``; ``block_cache_mb`` overrides the recorded
    block cache). The manifest's record also holds figures (row counts, bytes on disk) that
    ``StoreConfig.from_record`` leaves out. ``direct_reads`` overrides the recorded I/O mode (a server's
    ``--store-io``). ``manifest``: a Manifest, or a manifest's JSON (at least its ``store``)."""
    from offgraph.store import StoreConfig, open_store

    cfg = StoreConfig.from_record(store_record(manifest).to_dict())
    if block_cache_mb is not None:
        cfg = cfg.replace(block_cache_mb=block_cache_mb)
    if statistics:
        cfg = cfg.replace(statistics=True)
    if direct_reads is not None:
        cfg = cfg.replace(direct_reads=direct_reads)
    return open_store(Path(version_dir) / STORE_DIR, cfg, mode=mode)


def training_loss(manifest: Manifest | Mapping[str, Any], source: str = "manifest") -> str:
    """The loss a version was trained with: its manifest's ``training_loss``; a manifest without it (exported
    before it was recorded) reads its training config's ``loss``, and a version without either is pointwise.
    ``manifest``: a Manifest, or a manifest's JSON (the exporter's, before it is written)."""
    if isinstance(manifest, Manifest):
        loss, training = manifest.training_loss, manifest.training
    else:
        loss, training = manifest.get("training_loss"), manifest.get("training")
    if loss is None:
        config = training.get("config") if isinstance(training, dict) else None
        loss = config.get("loss", "pointwise") if isinstance(config, dict) else "pointwise"
    if loss not in LOSSES:
        raise ModelDirError(f"{source}: training loss {loss!r} is none of {list(LOSSES)}")
    return loss


def sampled_negative_rate(training: Mapping[str, Any] | None) -> float:
    """The share of negative rows each epoch trained on (``offgraph train --negative-rate``), from a run's record
    (a manifest's ``training``: its ``config``); 1.0 where none is recorded (every row, or a run from before)."""
    config = training.get("config") if isinstance(training, Mapping) else None
    rate = config.get("negative_rate", 1.0) if isinstance(config, Mapping) else 1.0
    return 1.0 if rate is None else float(rate)


def check_negative_rate(stated: float, sampled: float, source: str) -> None:
    """Refuse a spec whose ``model.calibration.negative_rate`` (the served correction) is not the rate the run
    sampled its negatives at, naming both: its scores would be corrected for another sampling than the one it
    was trained on. A run that sampled nothing (``sampled`` 1.0) may state a rate by hand: its data were sampled
    before training."""
    if sampled != 1.0 and stated != sampled:
        raise ModelDirError(
            f"{source}: the spec states model.calibration.negative_rate {stated:g}, and the run sampled negatives "
            f"at --negative-rate {sampled:g}: its served scores would be corrected for another rate than the "
            "one it was trained at (training writes the run's rate into the run's spec.yaml; leave it as written)"
        )
