"""The updater's status beside its model: ``MODELS/NAME/updater-status.json``, rewritten (atomically)
whenever its backlog figures are refreshed, so that the server's ``GET /v1/models/{name}``
shows the backlog and, for Kafka, the consumer lag per partition. Plain JSON, no heavy imports."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

STATUS_FILE = "updater-status.json"


def write_status(model_dir: str | Path, status: dict) -> None:
    path = Path(model_dir) / STATUS_FILE
    tmp = path.with_name(f".{STATUS_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({**status, "updated_unix": time.time(), "pid": os.getpid()}))
        os.replace(tmp, path)
    except OSError:  # a status is a courtesy: never stop applying deltas for it
        tmp.unlink(missing_ok=True)


def read_status(model_dir: str | Path) -> dict | None:
    """The status with its age (``age_seconds``), or None where no updater wrote one."""
    try:
        status = json.loads((Path(model_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(status, dict):
        return None
    updated = status.get("updated_unix")
    status["age_seconds"] = time.time() - updated if isinstance(updated, (int, float)) else None
    return status
