"""Did-you-mean hints for a misspelt name (a column, a spec key, an op), appended to an error message."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """ " (did you mean 'weekday'?)" for the closest known names, or "" when none is close (or the name is
    not text: a number is no misspelling of a name)."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def unknown_names(what: str, names: Iterable[str], known: Iterable[str], of: str = "") -> str:
    """ "unknown key(s) ['embeding_dim' (did you mean 'embedding_dim'?)]; allowed: [...]": each unknown name
    with its own hint; ``of`` follows the noun (" for op 'id'")."""
    allowed = sorted(known)
    parts = [repr(n) + did_you_mean(n, allowed) for n in sorted(names, key=str)]
    return f"unknown {what}(s) [{', '.join(parts)}]{of}; allowed: {allowed}"
