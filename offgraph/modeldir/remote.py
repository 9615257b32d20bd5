"""Model versions in object storage (``s3://BUCKET/PREFIX``, laid out as MODELS on disk:
``PREFIX/NAME/VERSION/...``): publish a local version, find the complete ones, copy one down verified.

A version in a bucket is complete when its ``manifest.json`` is there: :func:`upload_version` writes it
after every other file. :func:`copy_down` fetches the manifest first, then every file it records
(``checksums.files``: size and whole xxh3-128 at export; older versions: every object, checked by the
manifest's dense and store records as on disk), checks each, and only then writes the manifest into the
local copy and renames the copy into place: a copy that fails or is killed is never a complete version.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from offgraph.modeldir.manifest import _VERSION_RE, MANIFEST, ModelDirError, load_manifest
from offgraph.modeldir.manifest_model import Manifest
from offgraph.objectstore import ObjectStore
from offgraph.objectstore.transfer import UploadStats, download_objects, upload_tree

log = logging.getLogger("offgraph.modeldir")

FEATURES_DIR = "features"
"""A model's feature tables, shared by its versions (MODELS/NAME/features/): copied with a version."""


def upload_version(local: Path, store: ObjectStore, prefix: str, record: Path) -> UploadStats:
    """Publish the complete local version ``local`` as ``prefix`` (``NAME/VERSION`` under the store's
    root), the manifest last; resumable (``record``). Refuses a prefix that holds a complete version
    already (versions are immutable)."""
    if not (local / MANIFEST).is_file():
        raise ModelDirError(f"{local}: no {MANIFEST}: not a complete version, nothing to publish")
    if store.head(f"{prefix}/{MANIFEST}") is not None:
        raise ModelDirError(
            f"{store.location.scheme}://{store.location.bucket}/{prefix} is already a complete version; "
            "versions are immutable, publish to a new one"
        )
    return upload_tree(store, local, prefix, record=record, last=(MANIFEST,))


def complete_remote_versions(store: ObjectStore) -> dict[str, list[int]]:
    """Per model name under the store's prefix: its versions whose manifest is there, ascending."""
    root = store.location.key()
    out: dict[str, list[int]] = {}
    for obj in store.list(f"{root}/" if root else ""):
        parts = obj.key[len(root) :].strip("/").split("/")
        if len(parts) == 3 and parts[2] == MANIFEST and _VERSION_RE.fullmatch(parts[1]):
            out.setdefault(parts[0], []).append(int(parts[1]))
    return {name: sorted(v) for name, v in sorted(out.items())}


def remote_manifest(store: ObjectStore, name: str, version: int) -> tuple[bytes, Manifest]:
    key = store.location.key(name, str(version), MANIFEST)
    head = store.head(key)
    if head is None:
        raise ModelDirError(f"{store.location}/{name}/{version}: no {MANIFEST}: not a complete version")
    text = bytes(store.get_range(key, 0, head.size))
    try:
        return text, Manifest.from_json(text)
    except ValueError as e:
        raise ModelDirError(f"{store.location}/{name}/{version}/{MANIFEST}: unreadable manifest: {e}") from None


def version_bytes(manifest: Manifest) -> int | None:
    """What a version takes on disk by its manifest's file record (None: an older version without it)."""
    files = manifest.checksums.files
    return None if files is None else sum(r.bytes for r in files.values())


def copy_down(store: ObjectStore, name: str, version: int, model_dir: Path, *, concurrency: int = 16) -> Path:
    """Copy version ``name/version`` into ``model_dir/VERSION``, verified (see the module's doc); returns
    its path. ModelDirError names the first file missing, short or different; nothing is left behind then."""
    where = f"{store.location}/{name}/{version}"
    text, manifest = remote_manifest(store, name, version)
    prefix = store.location.key(name, str(version))
    listed = {o.key[len(prefix) + 1 :]: o.size for o in store.list(prefix + "/")}
    records = manifest.checksums.files
    if records is not None:
        wanted = {rel: r.bytes for rel, r in records.items()}
        for rel, size in wanted.items():
            if rel not in listed:
                raise ModelDirError(f"{where}: {rel} is missing (recorded at export, {size} bytes): incomplete copy")
            if listed[rel] != size:
                raise ModelDirError(f"{where}: {rel} is {listed[rel]} bytes, {size} at export: truncated or replaced")
    else:  # exported before the record: every object, checked by load_manifest below
        wanted = {rel: size for rel, size in listed.items() if rel != MANIFEST}
    dest = model_dir / str(version)
    staging = model_dir / f".copy-{version}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        got = download_objects(
            store,
            [(f"{prefix}/{rel}", staging / rel, size) for rel, size in wanted.items()],
            concurrency=concurrency,
            checksum=records is not None,
        )
        if records is not None:
            for rel, rec in records.items():
                if got[staging / rel] != rec.xxh3_128:
                    raise ModelDirError(
                        f"{where}: {rel} differs from the file exported (xxh3 {got[staging / rel][:12]}..., "
                        f"{rec.xxh3_128[:12]}... at export): corrupt or replaced"
                    )
        if manifest.feature_tables is not None:
            _copy_features(store, name, model_dir, concurrency)
        (staging / MANIFEST).write_bytes(text)  # last: the copy is a complete version from here on
        if records is None:
            load_manifest(staging)  # the dense tree and the store's files, as on disk
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def _copy_features(store: ObjectStore, name: str, model_dir: Path, concurrency: int) -> None:
    """The model's feature tables (shared by its versions), when the local copy lacks or differs from them."""
    prefix = store.location.key(name, FEATURES_DIR)
    local = model_dir / FEATURES_DIR
    objs = store.list(prefix + "/")
    todo = [
        (o.key, local / o.key[len(prefix) + 1 :], o.size)
        for o in objs
        if not (local / o.key[len(prefix) + 1 :]).is_file()
        or (local / o.key[len(prefix) + 1 :]).stat().st_size != o.size
    ]
    if todo:
        download_objects(store, todo, concurrency=concurrency, checksum=False)
