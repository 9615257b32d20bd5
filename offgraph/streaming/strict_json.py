"""JSON that is JSON: NaN and +-Infinity (an AUC over one class, a logloss of nothing) are written as null.

Python's ``json`` writes them as the bare tokens ``NaN`` / ``Infinity`` by default, which no strict parser
(``jq``, JavaScript, Go) reads. ``dumps`` maps every non-finite float to None (NumPy scalars and arrays
included) and then writes with ``allow_nan=False``, so a non-finite value that slips past the mapping is an
error here rather than a broken file downstream.
"""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by None, NumPy scalars and arrays as Python values."""
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        # NumPy arrays and scalars, read without importing NumPy (``offgraph --help`` imports this module)
        return finite_or_none(obj.tolist())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(finite_or_none(obj), allow_nan=False, **kw)


def write(path: str, obj: Any, **kw: Any) -> None:
    """Write ``obj`` as strict JSON to ``path`` (in full: the text is built before the file is opened)."""
    text = dumps(obj, **kw)
    with open(path, "w") as f:
        f.write(text)
