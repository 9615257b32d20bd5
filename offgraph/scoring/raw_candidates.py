"""A score body's candidates as sent: each one's JSON bytes, decoded only where the scorer needs it.

The HTTP server's score route parses a body's candidate list without decoding its candidates
(``offgraph.server.api.score_body.RawScoreBodyParser``), and the scorer looks each one's bytes up in its
candidate cache (``offgraph.scoring.candidate_cache``): a candidate it holds is never decoded. The
others are decoded in one call (``decode_list``: the server's decoder of a list of candidates, which
refuses what the body's schema refuses); a candidate it refuses, or any request the cache path does not
take, is scored from :meth:`RawCandidates.dicts`: the whole body validated as the server validates
any body (``decode_all``), which raises the 422 naming each problem, or gives every candidate's dict.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec


class RawCandidates(Sequence):
    """``raws[i]``: candidate i's JSON bytes as sent. As a sequence it holds the decoded candidates."""

    def __init__(
        self, raws: list[bytes], decode_list: Callable[[bytes], list[dict]], decode_all: Callable[[], Sequence[Any]]
    ):
        self.raws = raws
        self._decode_list = decode_list
        self._decode_all = decode_all
        self._dicts: Sequence[Any] | None = None

    def __len__(self) -> int:
        return len(self.raws)

    def __getitem__(self, i):  # type: ignore[override]
        return self.dicts()[i]

    def dicts(self) -> Sequence[Any]:
        """Every candidate decoded, as the server decodes a body (raises its 422 for an invalid one)."""
        if self._dicts is None:
            self._dicts = self._decode_all()
        return self._dicts

    def decode(self, which: Sequence[int]) -> list[dict] | None:
        """The candidates at ``which``, decoded in one call (as one JSON array of them); None when the
        decoder refuses one (:meth:`dicts` then says why, or accepts it: the body's schema is looser than
        the candidate decoder in places)."""
        raws = self.raws
        try:
            return self._decode_list(b"[" + b",".join([raws[i] for i in which]) + b"]")
        except msgspec.DecodeError:  # (a ValidationError is one)
            return None
