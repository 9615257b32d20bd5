"""``--models s3://BUCKET/PREFIX``: the versions in object storage, copied down into a bounded local cache
that the registry then serves as MODELS (``ServerConfig.models_dir`` is the cache folder).

Each scan (``ModelRegistry.poll_once``, the loader thread) lists the bucket's complete versions (manifest
present: a version still being uploaded has none) and copies down each model's newest one, and the
labelled or pinned ones, that the cache lacks: verified file by file against the sizes and xxh3-128 recorded
at export before its manifest is written into the cache (``offgraph.modeldir.remote.copy_down``), so only
a whole, checked copy is ever a complete version the registry may load. A copy that fails (a missing,
short or corrupt file, the store unreachable) is refused with the reason, which names the file, and tried
again after a backoff that doubles (``POLL``s to ``RETRY_MAX_S``); whatever serves keeps serving.

The cache holds at most ``--model-cache-mb``: before a copy, the versions no label or pin holds and that
do not serve (here, or in another worker by the saved admin policy) are removed, oldest first, until the
new one fits; when it cannot fit, the copy is refused saying so. Several worker processes share one
cache: one copies at a time (a lock file), the others find its result on their next scan.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from offgraph.modeldir.manifest import ModelDirError, check_model_name, complete_versions
from offgraph.modeldir.remote import complete_remote_versions, copy_down, remote_manifest, version_bytes
from offgraph.objectstore import open_store
from offgraph.server.models.refusals import RETRY_MAX_S

log = logging.getLogger("offgraph.server")

MiB = 1 << 20
LOCK_FILE = ".copy.lock"


@dataclass
class CopyRefusal:
    reason: str
    attempts: int
    retry_at: float


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class ModelCache:
    def __init__(self, uri: str, cache_dir: Path, bound_bytes: int, first_retry_s: float) -> None:
        self.uri, self.dir, self.bound = uri, Path(cache_dir), int(bound_bytes)
        self.store = open_store(uri)
        self.first_retry_s = first_retry_s
        self.refused: dict[tuple[str, int], CopyRefusal] = {}
        self.errors: dict[str, str] = {}  # model -> why its newest copy was refused (cleared once one copies)
        self.copied: list[dict] = []  # one record per version copied: name, version, bytes, seconds

    def sync(self, held: Callable[[str], set[int]]) -> None:
        """Copy down what the bucket has and the cache lacks (see the module's doc). ``held(name)``: the
        versions of a model that must stay in the cache (serving, loading, labelled, pinned)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / LOCK_FILE, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another worker copies now; its result is there at the next scan
            try:
                remote = complete_remote_versions(self.store)
            except OSError as e:
                log.error("cannot list %s (the cached versions keep serving): %s", self.uri, e)
                return
            for name, versions in remote.items():
                try:
                    check_model_name(name)
                except ModelDirError:
                    continue
                local = set(complete_versions(self.dir / name))
                wanted = {versions[-1]} | (held(name) & set(versions))
                for version in sorted(wanted - local, reverse=True):
                    refusal = self.refused.get((name, version))
                    if refusal is None or time.monotonic() >= refusal.retry_at:
                        self._copy(name, version, held)

    def _copy(self, name: str, version: int, held: Callable[[str], set[int]]) -> None:
        t0 = time.perf_counter()
        try:
            _, manifest = remote_manifest(self.store, name, version)
            need = version_bytes(manifest)
            if need is None:  # exported before the file record: what the bucket holds
                prefix = self.store.location.key(name, str(version))
                need = sum(o.size for o in self.store.list(prefix + "/"))
            self._make_room(need, held)
            (self.dir / name).mkdir(parents=True, exist_ok=True)
            copy_down(self.store, name, version, self.dir / name)
        except (ModelDirError, OSError, ValueError) as e:
            prev = self.refused.get((name, version))
            attempts = prev.attempts + 1 if prev else 1
            wait = min(RETRY_MAX_S, self.first_retry_s * 2 ** (attempts - 1))
            self.refused[(name, version)] = CopyRefusal(str(e), attempts, time.monotonic() + wait)
            self.errors[name] = f"version {version} from {self.uri} refused: {e}"
            log.error(
                "model %s: version %d from %s refused, tried again in %.0f s: %s", name, version, self.uri, wait, e
            )
            return
        secs = time.perf_counter() - t0
        self.refused.pop((name, version), None)
        self.errors.pop(name, None)
        self.copied.append({"name": name, "version": version, "bytes": need, "seconds": secs})
        log.info(
            "model %s: version %d copied down from %s and verified: %.1f MiB in %.2f s (%.0f MiB/s)",
            name,
            version,
            self.uri,
            need / MiB,
            secs,
            need / MiB / max(secs, 1e-9),
        )

    def _make_room(self, need: int, held: Callable[[str], set[int]]) -> None:
        """Remove versions nothing holds, oldest first, until ``need`` more bytes fit in the bound."""
        cached = [
            (version, name, self.dir / name / str(version))
            for name in sorted(os.listdir(self.dir))
            if (self.dir / name).is_dir()
            for version in complete_versions(self.dir / name)
        ]
        sizes = {path: tree_bytes(path) for _, _, path in cached}
        used = sum(sizes.values())
        for version, name, path in sorted(cached):
            if used + need <= self.bound:
                return
            if version in held(name):
                continue
            shutil.rmtree(path, ignore_errors=True)
            used -= sizes[path]
            log.info("model %s: version %d evicted from the model cache (%.1f MiB)", name, version, sizes[path] / MiB)
        if used + need > self.bound:
            raise ModelDirError(
                f"the version needs {need / MiB:.1f} MiB and the model cache {self.dir} holds {used / MiB:.1f} MiB "
                f"of versions that serve or are labelled or pinned: more than --model-cache-mb "
                f"{self.bound / MiB:g} allows"
            )
