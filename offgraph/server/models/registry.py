"""The models a server serves: discovery under MODELS, background loads, hot swaps, admin actions.

Every load runs in ONE loader thread (so two versions never load at once): the
poll task submits ``poll_once`` to it every ``poll_seconds``, admin actions submit
``load`` / ``rollback`` / ``unload``. A version that fails to load is refused with
its reason and tried again only once its files changed, with a backoff
(``offgraph.server.models.refusals``); the version being served keeps serving. A version whose store
fails to read while it serves is marked unhealthy (refused) and the previous version
is loaded in its place (``fall_back``). Admin decisions are saved under MODELS
(``offgraph.server.models.control.save_admin_policy``) and applied again when the server restarts.
With several workers, admin decisions taken by another worker are read from the
shared control directory (``offgraph.server.models.control``) and applied by ``sync_control``, in the
same loader thread.

Labels (``set_label``, ``remove_label``) load a second version beside the default one
(``offgraph.server.models.served``); the versions of a model that serve at once share its memory budget
equally (``_resize``: the ones serving shrink before a newcomer loads, and grow back once it goes).

An admin call (``admin``) never waits to be refused: what the model's state refuses now (an unknown
model or version, a label it does not have, nothing to roll back to) is refused at once
(``check_admin``, off the loader); the others queue for the loader, at most ``admin_queue`` of a model
at once, each for at most ``admin_wait_s`` before its turn (``AdminTurn``), else 429 with Retry-After
having done nothing. The loader checks each call again when its turn comes.

The registry holds plain state (``holders``: one ``ModelHolder`` a model, ``ready``); the API shapes its JSON
(``offgraph.server.api.model_status``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import copy_context
from pathlib import Path
from typing import Any, Literal

from offgraph.modeldir.manifest import MANIFEST, ModelDirError, check_model_name, complete_versions
from offgraph.modeldir.status_file import read_status
from offgraph.server.config import ServerConfig
from offgraph.server.models.control import (
    LABEL,
    LABEL_RULE,
    MAX_LABELS,
    Control,
    Policy,
    check_labels,
    load_admin_policy,
    save_admin_policy,
)
from offgraph.server.models.loader import open_version
from offgraph.server.models.pacing import Pacer
from offgraph.server.models.refusals import may_retry, refuse, version_signature
from offgraph.server.models.remote_cache import MiB, ModelCache
from offgraph.server.models.served import ModelHolder, ServedVersion

log = logging.getLogger("offgraph.server")

CONTROL_TICK_S = 0.25
"""With several workers: how often each applies the admin decisions of the others (and publishes metrics)."""


class AdminError(Exception):
    """An admin action that cannot be done; ``status`` is the HTTP status to answer, ``retry_after`` its
    ``Retry-After`` in seconds (None: no such header)."""

    def __init__(self, status: int, detail: str, retry_after: int | None = None):
        super().__init__(detail)
        self.status, self.detail, self.retry_after = status, detail, retry_after

    @property
    def headers(self) -> dict[str, str] | None:
        return None if self.retry_after is None else {"Retry-After": str(self.retry_after)}


AdminAction = Literal["load", "unload", "rollback", "set_label", "remove_label"]

ADMIN_BUSY = 429
"""An admin call that found its model's admin queue full, or whose turn did not come within ``admin_wait_s``:
nothing was done, retry after ``Retry-After``. Not 503: an admin 503 says the action WAS done but could not be
saved (``record_decision``), and must not be retried blindly."""


class AdminTurn:
    """One admin call's place in the loader's queue: the loader begins it, or the call gives up waiting
    (``abandon``) and the loader skips it; never both."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._lock = threading.Lock()
        self._began = self._abandoned = False
        self._begun = asyncio.Event()

    def begin(self) -> bool:
        """(loader thread) True: run the call; False: it gave up, skip it."""
        with self._lock:
            if self._abandoned:
                return False
            self._began = True
        try:
            self._loop.call_soon_threadsafe(self._begun.set)
        except RuntimeError:  # the loop is closed: nobody waits
            pass
        return True

    def abandon(self) -> bool:
        """True if the call gave up before the loader began it (it never will); False if it began."""
        with self._lock:
            if not self._began:
                self._abandoned = True
            return self._abandoned

    async def wait(self, done: asyncio.Future, timeout_s: float) -> bool:
        """Until the loader begins the call (True), or ``timeout_s`` passes before it does (False: abandoned)."""
        begun = asyncio.ensure_future(self._begun.wait())
        try:
            await asyncio.wait((done, begun), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the caller is gone (the server stops): do not begin it then
            self.abandon()
            done.cancel()  # nobody reads its outcome
            raise
        finally:
            begun.cancel()
        return not self.abandon()


RELEASE_SHARE = 0.1
"""Most of the wall clock that freeing a retired version's memory takes (``Scorer.release``)."""

FALLBACK_TRIES = 3
"""Versions tried, newest first after the previous one, when the served version's store fails."""


class ModelRegistry:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.models_dir = config.models_dir.resolve()
        self.holders: dict[str, ModelHolder] = {}
        self.loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offgraph-loader")
        self.initial_scan_done = False
        self.load_failures: dict[str, int] = {}
        self.control = (
            Control(config.control_dir, config.worker_id, config.workers) if config.control_dir is not None else None
        )
        self._applied: dict[str, int] = {}  # newest control generation applied, per model
        self._admin_calls: dict[str, int] = {}  # admin calls under way or waiting, per model (event loop only)
        self._closed = False
        # --models s3://...: MODELS is the local cache the versions are copied down into
        self.remote = (
            ModelCache(config.models_uri, self.models_dir, int(config.model_cache_mb * MiB), config.poll_seconds)
            if config.models_uri is not None
            else None
        )

    # -- discovery and polling (loader thread) --------------------------------------------------
    def check_models_dir(self) -> None:
        """One WARNING if MODELS is a model's own directory (or a version's), where no model can be
        found: the habit of TF Serving's ``--model_base_path``. Logged by the first worker only."""
        if self.config.worker_id != 0:
            return
        hint = one_model_dir_hint(self.models_dir)
        if hint is not None:
            log.warning("%s", hint)

    def discover(self) -> None:
        """Add a holder for every valid model name under MODELS that has a complete version."""
        try:
            entries = sorted(os.scandir(self.models_dir), key=lambda e: e.name)
        except OSError as e:
            log.error("cannot list %s: %s", self.models_dir, e)
            return
        for entry in entries:
            if entry.name in self.holders or not entry.is_dir():
                continue
            try:
                check_model_name(entry.name)
            except ModelDirError:
                log.warning("ignoring %s: not a valid model name", entry.path)
                continue
            if complete_versions(entry.path):
                h = ModelHolder(entry.name, self.models_dir / entry.name)
                h.on_store_error = self._on_store_error
                # the newcomer's first second is its coldest (row-cache misses): freeing the old one
                # must take less of it than the load did
                h.release_share = min(self.config.load_share, RELEASE_SHARE)
                try:
                    h.policy, h.pinned_version, h.labels = load_admin_policy(h.dir)
                except ValueError as e:
                    h.last_error = f"admin policy ignored (following the newest version): {e}"
                    log.error("model %s: %s", h.name, h.last_error)
                self.holders[entry.name] = h
                log.info(
                    "found model %s (policy %s%s)",
                    entry.name,
                    h.policy,
                    f" {h.pinned_version}" if h.policy == "pinned" else "",
                )

    def _wanted(self, holder: ModelHolder, versions: list[int]) -> list[int]:
        """Versions to try to load now, in order of preference (the first that loads is served)."""
        current = holder.current.version if holder.current is not None else None
        if holder.policy == "unloaded":
            return []
        if holder.policy == "pinned":
            pin = holder.pinned_version
            if current == pin:
                return []
            out = [pin] if pin in versions else []
            if not out and holder.last_error is None:
                holder.last_error = f"pinned version {pin} is not on disk (complete versions: {versions})"
            # nothing serves: the newest loadable version stands in until the pinned one loads
            return out + ([v for v in reversed(versions) if v != pin] if current is None else [])
        return [v for v in reversed(versions) if current is None or v > current]

    def poll_once(self) -> None:
        """One scan: new models; for each, load the version its policy wants (the newest, or the pinned
        one) unless it was refused and its files did not change since (or its backoff runs)."""
        if self._closed:
            return
        if self.remote is not None:
            self.remote.sync(self._held)
        self.discover()
        for holder in self.all():
            if self.remote is not None and holder.name in self.remote.errors:
                holder.last_error = self.remote.errors[holder.name]
            versions = holder.versions_on_disk = complete_versions(holder.dir)
            for v in self._wanted(holder, versions):
                if may_retry(holder.refused.get(v), holder.dir / str(v)) and self._load(holder, v):
                    break
            self._load_labels(holder, versions)
            holder.attempted = True
            holder.updater = read_status(holder.dir)
            holder.scans += 1
        self.initial_scan_done = True

    def _held(self, name: str) -> set[int]:
        """A model's versions the model cache must keep: serving or loading here, labelled or pinned (by this
        worker's state or the saved admin policy, which every worker follows), and the one an updater beside
        the cache writes (its status file): evicting that would pull its store out from under the updater
        while a newer version that failed to load, or a pin, keeps the server on another."""
        out: set[int] = set()
        h = self.holders.get(name)
        if h is not None:
            out |= {sv.version for sv in h.served()} | set(h.labels.values())
            out |= {v for v in (h.pinned_version, h.loading_version) if v is not None}
        try:
            _, pinned, labels = load_admin_policy(self.models_dir / name)
        except ValueError:
            pinned, labels = None, {}
        updating = read_status(self.models_dir / name) or {}
        if isinstance(updating.get("version"), int):
            out.add(updating["version"])
        return out | set(labels.values()) | ({pinned} if pinned is not None else set())

    def _hot_rows(self, holder: ModelHolder) -> dict | None:
        """The serving version's most recently used rows (``--warmup-rows`` at most), to warm the next."""
        sv = holder.current
        if sv is None or sv.closed or self.config.warmup_rows <= 0:
            return None
        try:
            return sv.scorer.hot_rows(self.config.warmup_rows)
        except Exception:  # noqa: BLE001 - a warm-up aid: never a reason not to load
            log.exception("model %s: reading the hot rows of version %d failed", holder.name, sv.version)
            return None

    def _load(self, holder: ModelHolder, version: int, note: str | None = None) -> bool:
        """Load, warm up and swap in one version; on failure refuse it (logged, reported) and return False.
        ``note``: the model's ``last_error`` once it serves (set before the swap, so that no status shows
        the new version without it). A labelled version already serving becomes the default as it is."""
        labelled = holder.extra.get(version)
        if labelled is not None:
            holder.last_error = note
            holder.swap(labelled)
            self._resize(holder)
            log.info("model %s: serving version %d by default (it served labelled)", holder.name, version)
            return True
        cur = holder.current
        # the versions that serve once it is in: the labelled ones, itself, and the old default if labelled
        stays = cur is not None and cur.version in holder.labels.values()
        versions = 1 + len(holder.extra) + int(stays)
        if stays:  # room for the newcomer first: the ones serving on shrink to their new share
            self._resize(holder, versions)
        sv = self._open(holder, version, versions)
        if sv is None:
            if stays:
                self._resize(holder)
            return False
        holder.refused.pop(version, None)
        holder.last_error = note
        holder.swap(sv)
        self._resize(holder)
        log.info("model %s: serving version %d (loaded and warmed up in %.2fs)", holder.name, version, sv.load_seconds)
        return True

    def _open(self, holder: ModelHolder, version: int, versions: int) -> ServedVersion | None:
        """Open, verify and warm up one version with its share of the memory budget (``versions`` of its
        model serving at once); on failure refuse it (logged, reported) and return None."""
        vdir = holder.dir / str(version)
        signature = version_signature(vdir)  # as the try begins: a change during it is retried
        holder.loading_version = version
        log.info("model %s: loading version %d", holder.name, version)
        try:
            # while any version serves, the load yields to its requests (offgraph.server.models.pacing), from its
            # first step on: selecting the hot rows sorts the serving version's whole row cache
            serving = any(h.current is not None for h in list(self.holders.values()))
            pacer = Pacer(self.config.load_share if serving else 1.0)
            hot = self._hot_rows(holder)
            pacer.tick()
            return open_version(vdir, self.config, len(self.holders), hot, pacer, serving=serving, versions=versions)
        except Exception as e:  # noqa: BLE001 - whatever it is, this version must not serve
            reason = f"{type(e).__name__}: {e}"
            holder.refused[version] = refuse(holder.refused.get(version), reason, signature, self.config.poll_seconds)
            holder.last_error = f"version {version} refused: {reason}"
            self.load_failures[holder.name] = self.load_failures.get(holder.name, 0) + 1
            log.error(
                "model %s: version %d refused, %s keeps serving: %s",
                holder.name,
                version,
                f"version {holder.current.version}" if holder.current else "nothing",
                reason,
            )
            return None
        finally:
            holder.loading_version = None

    # -- labels (loader thread) ----------------------------------------------------------------------
    def _resize(self, holder: ModelHolder, versions: int | None = None) -> None:
        """Give each version of the model that serves its share of the budget with ``versions`` of them
        serving (default: as many as serve now)."""
        served = holder.served()
        n = versions or len(served) or 1
        for sv in served:
            split = self.config.memory_split(len(self.holders), sv.memory.index_mb, n, sv.memory.item_tables)
            if split != sv.memory and not sv.closed:
                sv.resize(split)
                log.info(
                    "model %s: version %d now holds 1/%d of the model's memory: %s",
                    holder.name,
                    sv.version,
                    n,
                    split.describe(),
                )

    def _load_labelled(self, holder: ModelHolder, version: int) -> bool:
        """Load a labelled version to serve beside the default one; False (refused, reported) if it does not load."""
        versions = len(holder.served()) + 1
        self._resize(holder, versions)
        sv = self._open(holder, version, versions)
        if sv is None:
            self._resize(holder)
            return False
        holder.refused.pop(version, None)
        holder.add_labelled(sv)
        log.info(
            "model %s: serving version %d beside version %s (labelled %s)",
            holder.name,
            version,
            holder.current.version if holder.current else "none",
            ", ".join(k for k, v in sorted(holder.labels.items()) if v == version),
        )
        return True

    def _load_labels(self, holder: ModelHolder, versions: list[int]) -> None:
        """Load the labelled versions that do not serve (after a restart, or a refusal whose files changed)."""
        if holder.policy == "unloaded" or holder.current is None:
            return
        served = {sv.version for sv in holder.served()}
        for v in sorted(set(holder.labels.values()) - served):
            if v in versions and may_retry(holder.refused.get(v), holder.dir / str(v)):
                self._load_labelled(holder, v)

    def apply_labels(self, name: str, labels: dict[str, int]) -> None:
        """Make the model's labels ``labels`` (``{label: version}``): load the versions they name that do not
        serve yet, retire the ones no label names any more. AdminError (the labels stay as they were)
        if a version is not on disk or does not load."""
        h = self.holder(name)
        labels, h.versions_on_disk = self._check_labels(h, labels, at_arrival=False)
        old = h.labels
        h.labels = dict(labels)  # one assignment: a request reads the old labels or the new ones
        served = {sv.version for sv in h.served()}
        for v in sorted(set(labels.values()) - served):
            if not self._load_labelled(h, v):
                h.labels = old
                h.retire_unlabelled()
                self._resize(h)
                raise AdminError(409, f"model '{name}': {h.last_error}")
        if h.retire_unlabelled():
            self._resize(h)

    def _check_labels(self, h: ModelHolder, labels: dict, at_arrival: bool) -> tuple[dict[str, int], list[int]]:
        """``labels`` checked for the model (422, 409, 404 for a version not on disk) and its complete versions.
        ``at_arrival``: the check as a call comes (``check_admin``), where a model that serves nothing yet but
        is not unloaded passes (its first load may be under way: the call's turn comes after it); in the
        loader, such a model serves nothing: 409."""
        try:
            labels = check_labels(labels)
        except ValueError as e:
            raise AdminError(422, str(e)) from None
        if labels and (h.policy == "unloaded" or (h.current is None and not at_arrival)):
            raise AdminError(409, f"model '{h.name}' serves no version: load it before labelling versions")
        versions = complete_versions(h.dir)
        missing = sorted({v for v in labels.values() if v not in versions})
        if missing:
            raise AdminError(
                404, f"model '{h.name}' has no complete version {missing[0]} (complete versions: {versions})"
            )
        return labels, versions

    @staticmethod
    def _labels_with(h: ModelHolder, label: str, version: int) -> dict[str, int]:
        _check_label(label)
        labels = h.labels  # one read: the loader replaces the dict, never changes it
        if label not in labels and len(labels) >= MAX_LABELS:
            raise AdminError(409, f"model '{h.name}' has {MAX_LABELS} labels already: remove one first")
        return {**labels, label: version}

    @staticmethod
    def _labels_without(h: ModelHolder, label: str) -> dict[str, int]:
        _check_label(label)
        labels = h.labels
        if label not in labels:
            raise AdminError(404, f"model '{h.name}' has no label '{label[:40]}' (labels: {sorted(labels)})")
        return {k: v for k, v in labels.items() if k != label}

    def set_label(self, name: str, label: str, version: int) -> None:
        self.apply_labels(name, self._labels_with(self.holder(name), label, version))

    def remove_label(self, name: str, label: str) -> None:
        self.apply_labels(name, self._labels_without(self.holder(name), label))

    # -- admin actions (loader thread) ---------------------------------------------------------
    def holder(self, name: str) -> ModelHolder:
        h = self.holders.get(name)
        if h is None:
            raise AdminError(404, f"unknown model '{name}' (models: {sorted(self.holders)})")
        return h

    def load(self, name: str, version: int | None) -> None:
        h = self.holder(name)
        if version is None:  # back to following the newest version
            h.policy, h.pinned_version = "latest", None
            self.poll_once()
            if h.current is None:
                raise AdminError(409, f"model '{name}': no version could be loaded: {h.last_error}")
            return
        h.versions_on_disk = _complete_version(h, version)
        if h.current is None or h.current.version != version:
            if not self._load(h, version):
                raise AdminError(409, f"model '{name}': {h.last_error}")
        h.policy, h.pinned_version = "pinned", version

    def rollback(self, name: str) -> None:
        self.load(name, _previous_version(self.holder(name)))

    def unload(self, name: str) -> None:
        """Serve nothing of the model: its labels go too."""
        h = self.holder(name)
        h.policy, h.pinned_version, h.labels = "unloaded", None, {}
        h.swap(None)

    # -- admin calls (event loop) ------------------------------------------------------------------
    def check_admin(self, action: AdminAction, name: str, *args: Any) -> None:
        """Refuse (AdminError) an admin call that the model's state refuses now, without the loader: an
        unknown model; a version that is not complete on disk (``:load``, a label, the version to roll back
        to); nothing to roll back to; a label the model does not have (``DELETE``), a fifth label; labels
        for an unloaded model. Reads only (any thread; it lists the model's directory). The loader checks
        again when the call's turn comes: a version may vanish meanwhile."""
        h = self.holder(name)
        if action == "load":
            (version,) = args
            if version is not None:
                _complete_version(h, version)
        elif action == "rollback":
            _complete_version(h, _previous_version(h))
        elif action == "set_label":
            label, version = args
            self._check_labels(h, self._labels_with(h, label, version), at_arrival=True)
        elif action == "remove_label":
            (label,) = args
            self._check_labels(h, self._labels_without(h, label), at_arrival=True)

    def admin_calls(self, name: str) -> int:
        """Admin calls of the model under way or waiting for their turn (in this process)."""
        return self._admin_calls.get(name, 0)

    async def admin(self, action: AdminAction, name: str, *args: Any) -> Policy | None:
        """Do an admin call: refused at once if ``check_admin`` refuses it, or with ``ADMIN_BUSY`` if
        ``admin_queue`` calls of the model are under way or waiting; else it waits for its turn in the loader
        (at most ``admin_wait_s``, then ``ADMIN_BUSY``, nothing done), and runs there to its end: the action
        (checked again), then ``record_decision``, whose result (several workers) is returned."""
        actions: dict[str, Callable[..., None]] = {
            "load": self.load,
            "unload": self.unload,
            "rollback": self.rollback,
            "set_label": self.set_label,
            "remove_label": self.remove_label,
        }
        fn = actions[action]
        await asyncio.to_thread(self.check_admin, action, name, *args)
        calls = self._admin_calls.get(name, 0)
        if calls >= self.config.admin_queue:
            limit = self.config.admin_queue
            raise self._busy(
                name, f"its admin queue is full ({calls} calls under way or waiting, --admin-queue {limit})"
            )
        self._admin_calls[name] = calls + 1
        try:
            loop = asyncio.get_running_loop()
            turn = AdminTurn(loop)

            def job() -> Policy | None:
                if not turn.begin():
                    return None
                fn(name, *args)
                return self.record_decision(name)

            done = loop.run_in_executor(self.loader, copy_context().run, job)
            if not await turn.wait(done, self.config.admin_wait_s):
                raise self._busy(name, f"its turn did not come within {self.config.admin_wait_s:g}s")
            return await done
        finally:
            self._admin_calls[name] -= 1

    def _busy(self, name: str, why: str) -> AdminError:
        retry_after = max(1, math.ceil(self.config.admin_wait_s))
        loading = [f"model {h.name} version {h.loading_version}" for h in self.all() if h.loading_version is not None]
        doing = "a load is in progress (" + ", ".join(loading) + ")" if loading else "the loader is busy"
        return AdminError(
            ADMIN_BUSY,
            f"model '{name}': admin call not done: {why}; {doing}: retry in {retry_after}s",
            retry_after=retry_after,
        )

    # -- a store that fails while serving ----------------------------------------------------------
    def _on_store_error(self, holder: ModelHolder, sv: ServedVersion) -> None:
        """Called once per version by the scoring thread whose score failed on a store read."""
        try:
            self.loader.submit(self.fall_back, holder, sv)
        except RuntimeError:  # the server is stopping: the loader takes no more work
            pass

    def fall_back(self, holder: ModelHolder, sv: ServedVersion) -> None:
        """(loader thread) Refuse the unhealthy version (tried again once its files change) and serve the
        previous version instead, else the newest older loadable one; without any, it keeps serving."""
        if holder.current is not sv or self._closed:
            return
        v = sv.version
        vdir = holder.dir / str(v)
        holder.refused[v] = refuse(
            None, f"unhealthy: {sv.unhealthy}", version_signature(vdir), self.config.poll_seconds
        )
        self.load_failures[holder.name] = self.load_failures.get(holder.name, 0) + 1
        on_disk = complete_versions(holder.dir)
        candidates = [holder.previous_version] if holder.previous_version in on_disk else []
        candidates += [c for c in reversed(on_disk) if c < v and c not in candidates]
        tried = 0
        for c in candidates:
            if c == v or not may_retry(holder.refused.get(c), holder.dir / str(c)):
                continue
            if tried == FALLBACK_TRIES:
                break
            tried += 1
            note = f"version {v} is unhealthy ({sv.unhealthy}): fell back to version {c}"
            if self._load(holder, c, note=note):
                log.error("model %s: %s", holder.name, note)
                return
        holder.last_error = f"version {v} is unhealthy ({sv.unhealthy}) and no other version loads: it keeps serving"
        log.error("model %s: %s", holder.name, holder.last_error)

    # -- decisions shared between workers (loader thread) --------------------------------------------
    def record_decision(self, name: str) -> Policy | None:
        """After an admin action succeeded here: save the model's resulting policy under MODELS (a restart
        applies it again) and, with several workers, record it for the others."""
        h = self.holder(name)
        version = h.pinned_version if h.policy == "pinned" else None
        try:
            save_admin_policy(h.dir, h.policy, version, h.labels)
        except OSError as e:
            raise AdminError(
                503,
                f"model '{name}': done, but the decision could not be saved under MODELS and "
                f"would not survive a restart: {e}",
            ) from None
        if self.control is None:
            return None
        p = self.control.record(name, h.policy, version, h.labels)
        self._applied[name] = p.generation
        self.control.ack(p, True)
        return p

    def sync_control(self) -> None:
        """Apply the decisions other workers recorded since the last call, and acknowledge each."""
        if self.control is None or self._closed:
            return
        for name, p in self.control.policies().items():
            if p.generation <= self._applied.get(name, 0):
                continue
            self._applied[name] = p.generation
            if name not in self.holders:
                self.discover()
            try:
                if p.policy == "unloaded":
                    self.unload(name)
                elif p.policy == "latest":
                    self.load(name, None)
                else:
                    self.load(name, p.version)
                if p.policy != "unloaded":
                    self.apply_labels(name, p.labels)
            except AdminError as e:
                log.error(
                    "worker %d: model %s: cannot follow the admin decision %s %s: %s",
                    self.config.worker_id,
                    name,
                    p.policy,
                    p.version if p.version is not None else "",
                    e.detail,
                )
                self.control.ack(p, False, e.detail)
                continue
            log.info(
                "worker %d: model %s follows the admin decision: %s %s",
                self.config.worker_id,
                name,
                p.policy,
                p.version if p.version is not None else "",
            )
            self.control.ack(p, True)

    async def wait_for_workers(self, p: Policy, timeout_s: float) -> None:
        """Until every worker acknowledged ``p``; AdminError naming those that failed or did not answer."""
        control = self.control
        if control is None:  # one process: no other worker to wait for
            return
        deadline = time.monotonic() + timeout_s
        while True:
            acks = control.acks(p)
            failed = [f"worker {a.worker}: {a.detail}" for a in acks.values() if not a.ok]
            if failed:
                raise AdminError(409, f"model '{p.model}': done by this worker, but " + "; ".join(failed))
            if len(acks) == self.config.workers:
                return
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.config.workers)) - set(acks))
                raise AdminError(
                    504,
                    f"model '{p.model}': done by {len(acks)} of {self.config.workers} workers; "
                    f"workers {missing} did not follow within {timeout_s:g}s (they still may)",
                )
            await asyncio.sleep(0.05)

    # -- async wrappers ----------------------------------------------------------------------------
    async def run_in_loader(self, fn, *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.loader, fn, *args)

    async def poll_forever(self, on_tick=None) -> None:
        """Scan MODELS every ``poll_seconds``; with a control directory, apply the other workers'
        admin decisions (first, then every ``CONTROL_TICK_S``) and call ``on_tick`` as often."""
        tick = min(self.config.poll_seconds, CONTROL_TICK_S) if self.control is not None else self.config.poll_seconds
        next_poll = 0.0
        while True:
            try:
                if self.control is not None:
                    await self.run_in_loader(self.sync_control)
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + self.config.poll_seconds
                    await self.run_in_loader(self.poll_once)
                if self.control is not None:  # every worker's /readyz answers for all of them
                    await self.run_in_loader(self.control.publish_ready, self.ready)
                if on_tick is not None:
                    on_tick()
            except Exception:  # noqa: BLE001 - the poller must survive anything
                log.exception("polling %s failed", self.models_dir)
            await asyncio.sleep(tick)

    def close(self) -> None:
        self._closed = True
        self.loader.shutdown(wait=True, cancel_futures=True)
        for h in self.all():
            h.close()

    # -- state (the API's JSON of it: offgraph.server.api.model_status) -------------------------
    @property
    def ready(self) -> bool:
        """Every model found is serving (or unloaded by an admin), and there is at least one."""
        return (
            self.initial_scan_done
            and bool(self.holders)
            and all(h.current is not None or h.policy == "unloaded" for h in self.all())
        )

    def all(self) -> list[ModelHolder]:
        """The holders, by name (a copy: the loader thread may add models meanwhile)."""
        return [h for _, h in sorted(self.holders.copy().items())]


def _complete_version(h: ModelHolder, version: int) -> list[int]:
    """The model's complete versions on disk; AdminError 404 if ``version`` is not one of them."""
    versions = complete_versions(h.dir)
    if version not in versions:
        raise AdminError(404, f"model '{h.name}' has no complete version {version} (complete versions: {versions})")
    return versions


def _previous_version(h: ModelHolder) -> int:
    """The version to roll back to; AdminError 409 if there is none."""
    previous = h.previous_version
    if previous is None:
        raise AdminError(409, f"model '{h.name}' has no previous version to roll back to")
    return previous


def _check_label(label: str) -> None:
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise AdminError(400, f"invalid label {label[:40]!r}: {LABEL_RULE}")


def one_model_dir_hint(models_dir: os.PathLike) -> str | None:
    """What to pass instead when ``models_dir`` is one model's directory (it holds complete versions) or
    one version's (it holds a manifest); None when it is neither."""
    d = Path(models_dir)
    try:
        if (d / MANIFEST).is_file():
            what, parent = f"a model version's directory (it holds a {MANIFEST})", d.parent.parent
        elif versions := complete_versions(d):
            what, parent = f"one model's directory (it holds versions {', '.join(map(str, versions[-3:]))})", d.parent
        else:
            return None
    except OSError:
        return None
    return (
        f"--models {d} looks like {what}, so no model is found in it: --models names the directory that "
        f"holds the models, MODELS/NAME/VERSION; pass its parent (--models {parent})"
    )
