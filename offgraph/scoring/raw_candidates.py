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
Candidates that come decoded on every request (the rows of TF Serving's row format) are :meth:`RawCandidates.keyed`:
their JSON encoding keys the cache, so that a candidate that comes back is neither joined nor generated again.
Candidates that come as columns (named tensors, TF Serving's columnar format) are :meth:`RawCandidates.columns`: each
one's key is the JSON of its elements across the columns, made in C-level passes over the columns, and its dict is
made only where the cache lacks it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

import msgspec

_ENCODE = msgspec.json.Encoder().encode
_JSON_VALUES = frozenset({str, int, float, bool, type(None), list})


def _plain(values: list[Any], array: type = list) -> bool:
    """Whether JSON says each of ``values`` as it is (text, an int, a finite float, a boolean, null, arrays of those,
    an array being a ``list``, or a ``tuple`` where ``array`` says so: never both, as both say the same JSON):
    C-level passes over the values, one more over the arrays' elements and the floats where there are any."""
    kinds = set(map(type, values))
    if not kinds <= (_JSON_VALUES if array is list else _JSON_VALUES - {list} | {array}):
        return False
    if array in kinds:
        arrays: list[Any] = [v for v in values if type(v) is array]
        if not _plain(list(chain.from_iterable(arrays)), array):
            return False
    return float not in kinds or all(map(math.isfinite, (v for v in values if type(v) is float)))


COLUMN_KEY_TAG = b"["
"""Column keys are JSON arrays (the columns' description, then the candidate's elements); the other keys are JSON
objects (a candidate's own JSON, or its dict's): a key made one way never equals one made the other."""


def column_keys(description: Any, columns: Sequence[Sequence[Any]]) -> list[bytes] | None:
    """Each candidate's key in the candidate cache, for candidates given as ``columns`` (element i of each is
    candidate i's; JSON values, or tuples of them where a column sends a list as K elements): the JSON of
    ``description`` (what makes a candidate's dict of its elements, e.g. the columns' names and how each is read),
    then the JSON array of its elements. One-to-one on the candidate as sent under one description: None where an
    element is a value JSON cannot say (bytes, NaN, infinity, objects), or a column holds both lists and tuples."""
    if not columns:
        return None
    for c in columns:  # a column's arrays are lists (JSON) or tuples (K elements of a tensor), never both
        if not _plain(list(c), tuple if tuple in set(map(type, c)) else list):
            return None
    try:
        head = _ENCODE(description)
        rows = map(_ENCODE, zip(*columns))
        return list(map(head.__add__, rows))
    except (TypeError, msgspec.EncodeError, OverflowError):
        return None


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
        self._rows: Callable[[Sequence[int]], list[Any]] | None = None
        self.keyable = raws is not None

    @classmethod
    def decoded(cls, candidates: Sequence[Any]) -> RawCandidates:
        """Candidates given decoded (no bytes to key them by)."""
        out = cls(None, None, None)
        out._dicts = candidates
        return out

    @classmethod
    def keyed(cls, candidates: Sequence[Any]) -> RawCandidates:
        """Candidates given decoded, keyed by their JSON (msgspec's encoding, one C call per candidate). The
        encoding is one-to-one on what a decoded body holds (text, numbers, booleans, null, lists of those: 1 and
        1.0, "1" and 1 differ): the key is the candidate. Values JSON cannot say (bytes, NaN, objects) leave them
        unkeyed (:meth:`decoded`): checked over every value, in C-level passes."""
        try:
            plain = _plain(list(chain.from_iterable(map(dict.values, candidates))))
        except TypeError:  # not dicts
            plain = False
        if not plain:
            return cls.decoded(candidates)
        try:
            raws = list(map(_ENCODE, candidates))
        except (TypeError, msgspec.EncodeError, OverflowError):
            return cls.decoded(candidates)
        out = cls(raws, None, None)
        out._dicts = candidates
        return out

    @classmethod
    def columns(cls, n: int, keys: list[bytes] | None, rows: Callable[[Sequence[int]], list[Any]]) -> RawCandidates:
        """``n`` candidates given as columns: ``keys`` their cache keys (``column_keys``; None: not keyable),
        ``rows(which)`` the dicts of the candidates at ``which``, made when asked for (the ones the cache lacks)."""
        if keys is None:
            return cls.decoded(rows(range(n)))
        out = cls(keys, None, None)
        out._rows = rows
        return out

    def __len__(self) -> int:
        return len(self.raws) if self.raws is not None else len(self._dicts or ())

    @property
    def json_raws(self) -> list[bytes] | None:
        """Each candidate's JSON text (the body's bytes as sent, or :meth:`keyed`'s encoding), without decoding
        anything; None where there are none (candidates given decoded, or as columns: their keys are not JSON
        objects). The served log writes these as they are."""
        return self.raws if self._rows is None else None

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
        if self._rows is not None:
            return self._rows(which)
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
