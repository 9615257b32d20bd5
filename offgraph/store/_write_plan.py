"""NumPy planning of a ``write``: which input rows win (one per key) and which are stale.

Last-write-wins by sequence number: a row is replaced only by a strictly higher seq,
within a call as across calls. Of duplicates of one (table, row) key in a call the
highest seq wins, and of equal seqs the FIRST (as a later call with an equal seq is
skipped: so how updates are grouped into calls never changes the result); a row whose
stored seq is >= its new seq is not written. Without seqs, the later duplicate wins.
"""

from __future__ import annotations

import numpy as np


def check_seqs(seqs, n: int) -> np.ndarray:
    """``seqs`` as int64 [n]; ValueError unless integers >= 0 of the rows' length."""
    s = np.asarray(seqs)
    if s.ndim != 1 or len(s) != n:
        raise ValueError(f"seqs must be a 1-D array with one sequence number per row ({n}), got shape {s.shape}")
    if n and not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"seqs must be integers, got dtype {s.dtype}")
    if n and np.issubdtype(s.dtype, np.unsignedinteger) and int(s.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"seqs must be < 2**63, got {int(s.max())}")
    s = s.astype(np.int64, copy=False)
    if n and int(s.min()) < 0:
        raise ValueError(f"seqs must be >= 0, got {int(s.min())}")
    return s


def winners(t: np.ndarray, r: np.ndarray, seqs: np.ndarray | None) -> np.ndarray:
    """Indices of the input rows that win, one per distinct key, sorted by (table, row)."""
    n = len(r)
    if n <= 1:
        return np.arange(n)
    pos = np.arange(n)
    order = np.lexsort((pos, r, t) if seqs is None else (-pos, seqs, r, t))
    ts, rs = t[order], r[order]
    last = np.ones(n, dtype=bool)
    last[:-1] = (ts[1:] != ts[:-1]) | (rs[1:] != rs[:-1])
    return order[last]
