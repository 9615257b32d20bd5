"""A score body's candidates as sent: each one's JSON bytes, decoded only where the scorer needs it.

The HTTP server's score route parses a body's candidate list without decoding its candidates
(``offgraph.server.api.score_body.ScoreBodyParser``), and the scorer looks each one's bytes up in its
candidate cache (``offgraph.scoring.candidate_cache``): a candidate it holds is never decoded. The
others are decoded in one call (``decode_list``: the server's decoder of a list of candidates, which
refuses what the body's schema refuses); where it refuses one, the whole body is validated as the server
validates any body (``decode_all``), which raises the 422 naming each problem, or gives every candidate's
dict (the body's schema is looser than the candidate decoder in places).

Candidates already decoded (the library's ``Scorer.score`` on dicts, a body the schema took where msgspec did
not) are :meth:`RawCandidates.decoded`: no bytes (``raws`` None), nothing to key the candidate cache with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec


class RawCandidates(Sequence):
    """``raws[i]``: candidate i's JSON bytes as sent (None: given decoded). As a sequence it holds the decoded
    candidates. ``keyable``: whether what was decoded can be held by its bytes (False once the whole body was
    validated: the schema's values, not the candidate decoder's)."""

    def __init__(
        self,
        raws: list[bytes] | None,
        decode_list: Callable[[bytes], list[dict]] | None,
        decode_all: Callable[[], Sequence[Any]] | None,
    ):
        self.raws = raws
        self._decode_list = decode_list
        self._decode_all = decode_all
        self._dicts: Sequence[Any] | None = None
        self.keyable = raws is not None

    @classmethod
    def decoded(cls, candidates: Sequence[Any]) -> RawCandidates:
        """Candidates given decoded (no bytes to key them by)."""
        out = cls(None, None, None)
        out._dicts = candidates
        return out

    def __len__(self) -> int:
        return len(self.raws) if self.raws is not None else len(self._dicts or ())

    def __getitem__(self, i):  # type: ignore[override]
        return self.dicts()[i]

    def dicts(self) -> Sequence[Any]:
        """Every candidate decoded: in one call of the candidate decoder, else as the server validates a body
        (raises its 422 for an invalid one)."""
        if self._dicts is None:
            got = self._decode(range(len(self)))
            self._dicts = got if got is not None else self._whole()
        return self._dicts

    def decode(self, which: Sequence[int]) -> list[Any]:
        """The candidates at ``which``: decoded in one call (as one JSON array of them); where the decoder refuses
        one, taken from the whole body validated (:meth:`dicts`: its 422, or the schema's values)."""
        if self._dicts is None:
            got = self._decode(which)
            if got is not None:
                return got
        every = self._dicts if self._dicts is not None else self._whole()
        return [every[i] for i in which]

    def _decode(self, which: Sequence[int]) -> list[dict] | None:
        raws = self.raws
        assert raws is not None and self._decode_list is not None
        try:
            return self._decode_list(b"[" + b",".join([raws[i] for i in which]) + b"]")
        except msgspec.DecodeError:  # (a ValidationError is one)
            return None

    def _whole(self) -> Sequence[Any]:
        assert self._decode_all is not None
        self._dicts = self._decode_all()
        self.keyable = False
        return self._dicts
