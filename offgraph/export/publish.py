"""Export or synth into object storage (``--out s3://BUCKET/PREFIX/NAME/VERSION``): the version is written
into a local staging folder as it is on disk, then uploaded, manifest last (``offgraph.modeldir.remote``).

The staging folder is named for the URI (under ``$XDG_CACHE_HOME/offgraph/uploads/``, or
``OFFGRAPH_UPLOAD_DIR``) and kept until the upload is complete, with the upload's resume record: the same
command run again after a kill uploads only what is not there yet, from the version already written
(a version is not rewritten: its store files would differ byte for byte).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from offgraph.modeldir.manifest import MANIFEST, check_model_name, load_manifest
from offgraph.modeldir.manifest_model import Manifest
from offgraph.modeldir.remote import upload_version
from offgraph.objectstore import Location, open_store
from offgraph.objectstore.transfer import UploadStats

log = logging.getLogger("offgraph.export")

UPLOAD_DIR_ENV = "OFFGRAPH_UPLOAD_DIR"


def staging_dir(uri: str) -> Path:
    root = os.environ.get(UPLOAD_DIR_ENV) or Path(
        os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "offgraph", "uploads"
    )
    return Path(root) / hashlib.sha256(uri.encode()).hexdigest()[:16]


def check_version_uri(uri: str) -> tuple[Location, str, int]:
    """``uri`` must be ``scheme://BUCKET/.../NAME/VERSION``; returns (location, name, version)."""
    loc = Location.parse(uri)  # an unsupported scheme is refused here, naming it
    parts = loc.prefix.split("/")
    if len(parts) < 2 or not parts[-1].isdigit():
        raise ValueError(f"--out must end in NAME/VERSION (an integer version), got {uri}")
    check_model_name(parts[-2])
    return loc, parts[-2], int(parts[-1])


def publish(uri: str, write: Callable[[Path], Manifest]) -> tuple[Manifest, UploadStats]:
    """Write the version with ``write(local_version_dir)`` (skipped when an earlier run wrote it whole)
    and upload it to ``uri``; returns its manifest and what the upload did."""
    loc, _, version = check_version_uri(uri)
    store = open_store(str(loc))
    if store.head(loc.key(MANIFEST)) is not None:  # before hours of writing
        raise ValueError(f"{uri} is already a complete version; versions are immutable, export to a new one")
    staging = staging_dir(str(loc))
    local = staging / str(version)
    if (local / MANIFEST).is_file():
        log.info("%s: resuming the upload of the version written in %s", uri, local)
        manifest = load_manifest(local)
    else:
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "uri").write_text(str(loc))
        (staging / "upload.json").unlink(missing_ok=True)  # a new local version: nothing of it is uploaded
        manifest = write(local)
    stats = upload_version(local, store, loc.prefix, staging / "upload.json")
    shutil.rmtree(staging)
    return manifest, stats
