"""Admin decisions shared by the worker processes of one server (``serve --workers N``).

An admin call reaches ONE worker. That worker applies it, then records the resulting
policy of the model in ``CONTROL/policy/<model>.json`` (atomic rename); every worker
checks these records a few times a second, applies a newer one (same code as the admin
call) and acknowledges it in ``CONTROL/acks/<worker>/<model>.json``. The worker that
took the call answers once every worker has acknowledged (or the wait times out), so
after a 200 every worker serves what the admin asked for. A worker that starts (or is
restarted) applies the recorded policies before it reports ready.

A record is ``{"policy": "latest" | "pinned" | "unloaded", "version": int | null,
"labels": {label: version}, "generation": int}``; generations are nanosecond timestamps, a later
decision wins. A record without ``labels`` (written before labels existed) has none.

Readiness is shared the same way: each worker keeps ``CONTROL/ready/<worker>.json``
(``{"ready": bool, "pid": int}``) up to date, and ``/readyz`` answers 200 only when every
worker is ready, whichever worker the kernel hands the probe to; a worker whose process is
gone counts as not ready.

The control directory lives as long as the server. What must survive a restart, the model's
policy itself, is also kept in ``MODELS/<model>/admin-policy.json`` (``save_admin_policy``,
written and fsynced before the admin call answers; read when the model is discovered).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

POLICIES = ("latest", "pinned", "unloaded")

LABEL_PATTERN = "^[a-z][a-z0-9_-]{0,31}$"
"""A version label: lower-case letters, digits, ``_`` and ``-``, starting with a letter (``stable``, ``canary``)."""
LABEL = re.compile(LABEL_PATTERN)
LABEL_RULE = "lower-case letters, digits, _ and -, a letter first, at most 32"

MAX_LABELS = 4
"""Labels per model: each labelled version holds a share of the model's memory while it serves."""


def check_labels(labels: object) -> dict[str, int]:
    """``labels`` as ``{label: version}``; ValueError naming what is wrong."""
    if not isinstance(labels, dict):
        raise ValueError(f"labels must be an object of label -> version, got {type(labels).__name__}")
    if len(labels) > MAX_LABELS:
        raise ValueError(f"at most {MAX_LABELS} labels a model, got {len(labels)}")
    for k, v in labels.items():
        if not isinstance(k, str) or not LABEL.fullmatch(k):
            raise ValueError(f"label {k!r} is not a label ({LABEL_RULE})")
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"label {k!r}: a version is an int >= 0, got {v!r}")
    return dict(labels)


@dataclass(frozen=True)
class Policy:
    model: str
    policy: str
    version: int | None
    generation: int
    labels: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Ack:
    worker: int
    generation: int
    ok: bool
    detail: str


ADMIN_POLICY_FILE = "admin-policy.json"


def _write_json(path: Path, obj: dict, durable: bool = False) -> None:
    """Atomically (rename); ``durable``: the file and the rename are on disk when this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj))
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _alive(pid) -> bool:
    """The process exists and has not exited (a killed worker stays a zombie until the supervisor reaps it)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: whether the pid exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def save_admin_policy(model_dir: Path, policy: str, version: int | None, labels: dict[str, int] | None = None) -> Path:
    """Record a model's admin policy and labels under MODELS (durably): a restarted server applies them."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    path = Path(model_dir) / ADMIN_POLICY_FILE
    record = {"policy": policy, "version": version, "labels": check_labels(labels or {}), "generation": time.time_ns()}
    _write_json(path, record, durable=True)
    return path


def load_admin_policy(model_dir: Path) -> tuple[str, int | None, dict[str, int]]:
    """The recorded admin policy of a model: (policy, pinned version, labels); ("latest", None, {}) when
    there is none. ValueError naming the file if it cannot be used."""
    path = Path(model_dir) / ADMIN_POLICY_FILE
    if not path.exists():
        return "latest", None, {}
    d = _read_json(path)
    if not isinstance(d, dict) or d.get("policy") not in POLICIES:
        raise ValueError(f"{path}: not an admin policy record (policy one of {POLICIES})")
    version = d.get("version")
    if d["policy"] == "pinned" and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
        raise ValueError(f"{path}: a pinned policy needs a version >= 0, got {version!r}")
    try:
        labels = check_labels(d.get("labels", {}))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return d["policy"], (version if d["policy"] == "pinned" else None), labels


class Control:
    def __init__(self, root: str | Path, worker: int, workers: int):
        self.root, self.worker, self.workers = Path(root), worker, workers
        (self.root / "policy").mkdir(parents=True, exist_ok=True)
        (self.root / "acks" / str(worker)).mkdir(parents=True, exist_ok=True)
        (self.root / "ready").mkdir(parents=True, exist_ok=True)
        self._ready: bool | None = None
        self.publish_ready(False)  # a restarted worker is not ready until it has loaded again

    def publish_ready(self, ready: bool) -> None:
        """Record this worker's readiness (written when it changes)."""
        if ready != self._ready:
            _write_json(self.root / "ready" / f"{self.worker}.json", {"ready": bool(ready), "pid": os.getpid()})
            self._ready = ready

    def workers_not_ready(self) -> list[int]:
        """The workers that have not recorded themselves ready, or whose process is gone."""
        out = []
        for w in range(self.workers):
            d = _read_json(self.root / "ready" / f"{w}.json")
            if not isinstance(d, dict) or d.get("ready") is not True or not _alive(d.get("pid")):
                out.append(w)
        return out

    def record(self, model: str, policy: str, version: int | None, labels: dict[str, int] | None = None) -> Policy:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        p = Policy(model, policy, version, time.time_ns(), check_labels(labels or {}))
        _write_json(
            self.root / "policy" / f"{model}.json",
            {"policy": policy, "version": version, "labels": p.labels, "generation": p.generation},
        )
        return p

    def policies(self) -> dict[str, Policy]:
        out = {}
        for path in sorted((self.root / "policy").glob("*.json")):
            d = _read_json(path)
            if d is None or d.get("policy") not in POLICIES:
                continue
            try:
                labels = check_labels(d.get("labels", {}))
            except ValueError:
                continue
            out[path.stem] = Policy(path.stem, d["policy"], d.get("version"), int(d.get("generation", 0)), labels)
        return out

    def ack(self, p: Policy, ok: bool, detail: str = "") -> None:
        _write_json(
            self.root / "acks" / str(self.worker) / f"{p.model}.json",
            {"generation": p.generation, "ok": ok, "detail": detail},
        )

    def acks(self, p: Policy) -> dict[int, Ack]:
        """Acknowledgements of ``p`` (or of a later decision) by worker."""
        out = {}
        for w in range(self.workers):
            d = _read_json(self.root / "acks" / str(w) / f"{p.model}.json")
            if d is not None and int(d.get("generation", 0)) >= p.generation:
                out[w] = Ack(w, int(d["generation"]), bool(d.get("ok")), str(d.get("detail", "")))
        return out
