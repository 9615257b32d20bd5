"""A model's versions as the clients of TensorFlow Serving and KServe ask about them.

``version_status``: TF Serving's ``model_version_status`` (``GET /v1/models/{name}``, ``/versions/{v}``): the
serving versions, default and labelled (AVAILABLE), the one being loaded (LOADING), the one served before it
and the refused ones (END; a refused one with its reason). ``serving_version``: the version whose spec the metadata routes describe.
"""

from __future__ import annotations

from typing import Any

from offgraph.server.http.errors import ApiError
from offgraph.server.models.served import ModelHolder, NotServing, ServedVersion


def _entry(version: int, state: str, reason: str | None = None) -> dict[str, Any]:
    status = (
        {"error_code": "OK", "error_message": ""}
        if reason is None
        else {"error_code": "UNKNOWN", "error_message": reason}
    )
    return {"version": str(version), "state": state, "status": status}


def version_status(holder: ModelHolder) -> list[dict[str, Any]]:
    """The model's ``model_version_status`` entries, newest version first (reasons unredacted: render them
    through ``offgraph.server.http.redact``)."""
    refused = {v: r.reason for v, r in list(holder.refused.items())}  # a copy: the loader thread adds to it
    out: dict[int, dict[str, Any]] = {}
    if holder.previous_version is not None:
        out[holder.previous_version] = _entry(holder.previous_version, "END")
    for v, reason in refused.items():
        out[v] = _entry(v, "END", reason)
    loading = holder.loading_version
    if loading is not None:
        out[loading] = _entry(loading, "LOADING")
    for sv in holder.served():  # an unhealthy version that still serves (nothing to fall back to) keeps its reason
        out[sv.version] = _entry(sv.version, "AVAILABLE", refused.get(sv.version))
    return [out[v] for v in sorted(out, reverse=True)]


def serving_version(holder: ModelHolder, version: int | None = None, label: str | None = None) -> ServedVersion:
    """The version that serves (``version`` or ``label``: that one): ``ModelLoading`` (a 503) while the model's
    first load runs, an ``ApiError`` 404 when none serves or not the one asked for."""
    try:
        sv = holder.acquire(version, label)
    except NotServing as e:
        raise ApiError(404, str(e)) from None
    holder.release(sv)  # its spec and score kind stay readable once it is closed
    return sv
