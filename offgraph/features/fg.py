"""Batch feature generation: raw features -> per-field row ids in ragged form.

The one FG used by training (``transform_columns``: every row carries all its
raw columns) and by serving (``transform``: one request + N candidates, the
request-scope fields computed once and broadcast). Row ids come out as
``RaggedIds`` (flat ``ids`` + ``offsets``), ready for a de-duplicated,
vectorized store lookup or for padding into a Keras batch.

Raw feature names are the spec's ``input`` columns; a missing key, None, NaN,
"" or [] is no value; keys the spec does not read are ignored.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from typing import Any, cast

import numpy as np

from offgraph.features.hashing import rows_of
from offgraph.features.numeric import finish, numeric_values, pre_standardize
from offgraph.features.ops import DERIVED_OPS, RAW_OPS, FeatureValueError, Values
from offgraph.features.segment import prepare
from offgraph.features.spec import LIST_OPS, FeatureSpec, FieldSpec
from offgraph.features.value_limits import Bound, TooManyValues, keep_last
from offgraph.features.vocabulary import UNKNOWN_ROW, AppendedKeys

__all__ = ["FeatureGenerator", "RaggedIds", "FGBatch", "FeatureValueError", "ScopeError", "TooManyValues"]


class ScopeError(FeatureValueError):
    """A raw input sent where the model does not read it: a request-scope input inside a candidate, or an
    item-scope input in the request. Scored anyway it would be no value there: a silently wrong score."""

    def __init__(self, key: str, where: str, belongs: str):
        home = "in 'request' (once per request)" if belongs == "request" else "in each of 'candidates'"
        article = "an" if belongs == "item" else "a"
        super().__init__(
            f"input '{key}' sent in {where}: the model reads it as {article} {belongs}-scope input, "
            f"only {home}; move it there"
        )
        self.key, self.where, self.belongs = key, where, belongs


@dataclass(frozen=True)
class RaggedIds:
    """Row ids of one field for n rows: row i owns ``ids[offsets[i]:offsets[i+1]]``."""

    ids: np.ndarray  # int64 [total]
    offsets: np.ndarray  # int64 [n + 1]

    @property
    def n(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def padded(self, max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(ids [n, L] int64, mask [n, L] float32); values past ``max_len`` are dropped."""
        lengths = self.lengths
        L = int(lengths.max(initial=0)) if max_len is None else max_len
        L = max(L, 1)
        col = np.arange(L)[None, :]
        mask = col < lengths[:, None]
        idx = np.minimum(self.offsets[:-1, None] + col, max(len(self.ids) - 1, 0))
        ids = np.where(mask, self.ids[idx] if len(self.ids) else 0, 0).astype(np.int64)
        return ids, mask.astype(np.float32)


@dataclass(frozen=True)
class FGBatch:
    """FG output for n rows: one RaggedIds per field, in spec order.

    ``broadcast[f]`` is True for request-scope fields computed once (their
    RaggedIds has n == 1) and shared by all n candidates. ``dense`` [n, k] float32: the
    numeric fields' values (``offgraph.features.numeric``), in ``spec.numeric`` order.
    ``ignored_keys``: raw keys of the request and candidates that the spec does not read (serving).

    ``segment_of[f]``, when given and not None: field f's RaggedIds holds the field's distinct value
    lists once each (a cross of one request and the genre sets of a thousand films has a few hundred),
    and candidate i's is ``segment_of[f][i]`` (int64 [n]). :meth:`per_row` lays such a batch out one
    RaggedIds row per candidate, as ``transform_columns`` does.
    """

    n: int
    fields: tuple[RaggedIds, ...]
    broadcast: tuple[bool, ...]
    dense: np.ndarray | None = None
    ignored_keys: int = 0
    segment_of: tuple[np.ndarray | None, ...] | None = None

    def per_row(self) -> FGBatch:
        """The same batch with every grouped field (``segment_of``) expanded to one row per candidate."""
        if self.segment_of is None:
            return self
        fields = tuple(rag if seg is None else _per_row(rag, seg) for rag, seg in zip(self.fields, self.segment_of))
        return FGBatch(self.n, fields, self.broadcast, self.dense, self.ignored_keys)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _ragged_gather(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> RaggedIds:
    """Row i = ``flat[starts[i]:starts[i] + lengths[i]]`` (vectorized)."""
    offsets = _offsets(lengths)
    if len(lengths) and (lengths == 1).all():
        return RaggedIds(flat[starts], offsets)
    idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return RaggedIds(flat[idx], offsets)


def _per_row(groups: RaggedIds, group_of: np.ndarray) -> RaggedIds:
    """Row i = ``groups`` row ``group_of[i]``: distinct value lists laid out one row per candidate."""
    return _ragged_gather(groups.ids, groups.offsets[:-1][group_of], groups.lengths[group_of])


class _ValueSets:
    """One request's value-set ids [n, item fields] (``FeatureGenerator._new_entries``), and their distinct
    groups per set of columns, computed once a request: an item field and every cross that reads only it
    (MovieLens' genres and its three crosses) share one sort."""

    def __init__(self, vids: np.ndarray):
        self.vids = vids
        self._memo: dict[tuple[int, ...], tuple[list, np.ndarray, np.ndarray]] = {}

    def distinct(self, cols: tuple[int, ...]) -> tuple[list, np.ndarray, np.ndarray]:
        """(each group's key: a value-set id, or a tuple of them for several columns; a candidate of each group
        [G]; the group of each candidate [n])."""
        got = self._memo.get(cols)
        if got is None:
            if len(cols) == 1:
                ukeys, rep, inv = np.unique(self.vids[:, cols[0]], return_index=True, return_inverse=True)
                keys: list = ukeys.tolist()
            else:
                ukeys, rep, inv = np.unique(self.vids[:, cols], axis=0, return_index=True, return_inverse=True)
                keys = [tuple(k) for k in ukeys.tolist()]
            got = self._memo[cols] = (keys, rep, inv.reshape(-1))
        return got


def _at_request(row: int) -> str:
    return "request"


def freeze_value(v: Any):
    """A hashable key for a raw value that tells apart values FG hashes differently
    (lists -> tuples, NaN -> None, bools tagged since True == 1)."""
    if isinstance(v, (list, tuple, np.ndarray)):
        return tuple(freeze_value(x) for x in v)
    if isinstance(v, dict):
        return ("__dict__",)  # invalid anyway: FG reports it on a miss
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, (bool, np.bool_)):
        return ("__bool__", bool(v))  # True == 1 in Python, but "true" != "1" when hashed
    return v


_LIST = object()
"""Marks a list inside a flat item-cache key: ``[a, b]`` becomes ``_LIST, 2, a, b`` (no JSON value is
this object, so a key reads back one way only)."""


def _fast_key(values) -> tuple:
    """Item-cache key of plain values (a list -> ``_LIST``, its length and its items, NaN -> None);
    TypeError for anything needing the exact ``freeze_value`` key: nested or non-plain values (when
    the key is hashed), and bools (True == 1). The key is one flat tuple of atomic values, so the
    cyclic GC untracks it the first time it sees it (a tuple inside it would keep it tracked for
    another collection: see ``FeatureGenerator._new_entries``)."""
    out = []
    for v in values:
        t = type(v)
        if t is list:
            kinds = set(map(type, v))  # True == 1: a bool takes the exact key (``True in v`` would catch 1 too)
            if bool in kinds or np.bool_ in kinds:
                raise TypeError
            out.append(_LIST)
            out.append(len(v))
            out.extend(v)
        elif t is bool or t is np.bool_:
            raise TypeError
        else:
            out.append(None if t is float and v != v else v)
    return tuple(out)


_SCALARS = frozenset({str, int, float, type(None)})
"""Types of a value whose ``_fast_key`` is the value itself (a float once it is known not to be NaN)."""


def _column_layout(col: list) -> bool | None:
    """How one item input's column of all candidates enters the fast keys: False when every value is a
    plain scalar (no NaN), True when every value is a list of plain scalars, None when some value needs
    ``_fast_key``'s checks or the exact ``freeze_value`` key (a bool, NaN, a mix, anything else)."""
    kinds = set(map(type, col))
    if kinds <= _SCALARS:
        if float in kinds and any(v != v for v in col if type(v) is float):
            return None
        return False
    if kinds == {list} and set(map(type, chain.from_iterable(col))) <= _SCALARS:
        return True  # a NaN inside a list stays as it is, as in ``_fast_key``
    return None


_KEY_BUILDERS: dict[tuple[bool, ...], Callable[..., tuple]] = {}


def _key_builder(layout: tuple[bool, ...]) -> Callable[..., tuple]:
    """A function of one candidate's item values (columns laid out as ``layout``: True for lists) that
    returns their ``_fast_key``, made once per layout: one tuple display, no per-value Python loop."""
    fn = _KEY_BUILDERS.get(layout)
    if fn is None:
        args = [f"v{j}" for j in range(len(layout))]
        parts = [f"_LIST, len({a}), *{a}" if is_list else a for a, is_list in zip(args, layout)]
        fn = eval(f"lambda {', '.join(args)}: ({', '.join(parts)},)", {"_LIST": _LIST})
        _KEY_BUILDERS[layout] = fn
    return fn


def fast_keys(columns: Sequence[list]) -> list[tuple] | None:
    """``_fast_key`` of every candidate given its item inputs column-wise (``columns[j][i]``: input j of
    candidate i), built column by column; None when some column needs the per-candidate keys
    (``_column_layout``). Keys are not hashed here: an unhashable value inside a list raises at lookup."""
    layout = []
    for col in columns:
        kind = _column_layout(col)
        if kind is None:
            return None
        layout.append(kind)
    if not columns:
        return None
    return list(map(_key_builder(tuple(layout)), *columns))


ADOPT_CHUNK = 8192
"""Items per step when a generator adopts another's item cache (each step holds the GIL)."""

RELEASE_CHUNK = 4096
"""Cache entries freed per step of :meth:`FeatureGenerator.release` (a millisecond or two of deallocation)."""


class FeatureGenerator:
    """Runs a spec's FG. ``item_cache_size`` > 0 caches item-scope results per item.

    ``transform`` (serving) refuses a row over a field's ``max_values`` and, with
    ``max_request_values``, a request over that many values (``offgraph.features.value_limits``);
    ``transform_columns`` (training) takes every value. A field with ``overflow: keep_last`` is cut
    to its last ``max_values`` values by both, never refused for its length.
    """

    def __init__(
        self,
        spec: FeatureSpec,
        item_cache_size: int = 0,
        cross_memo_size: int = 50_000,
        max_request_values: int | None = None,
    ):
        if max_request_values is not None and (
            isinstance(max_request_values, bool) or not isinstance(max_request_values, int) or max_request_values < 1
        ):
            raise ValueError(f"max_request_values must be an integer >= 1 or None, got {max_request_values!r}")
        self.max_request_values = max_request_values
        self.spec = spec
        self.hash = spec.model.hash
        self._fields = spec.fields
        self._request = [f for f in spec.fields if f.scope == "request"]
        self._item = [f for f in spec.fields if f.scope == "item"]
        self._cross = [f for f in spec.fields if f.scope == "cross"]
        self._item_inputs = spec.raw_inputs("item", numeric=False)  # the item cache's key: table fields only
        self._numeric = spec.numeric
        for f in spec.fields:
            if f.op == "tokenize":
                prepare(f.params.get("segmenter", "whitespace"))
        # scope checks of serving (``check_scopes``): keys read from one place only
        req_in, item_in = set(spec.raw_inputs("request")), set(spec.raw_inputs("item"))
        self._request_only, self._item_only = frozenset(req_in - item_in), frozenset(item_in - req_in)
        self._req_keys, self._item_keys = frozenset(req_in), frozenset(item_in)
        self._cache_size = item_cache_size
        # item cache entry: (values per item field (None for a field no cross reads), ids of all
        # item fields back to back (int64 bytes), ids count per item field then value-set id per item
        # field (int64 bytes))
        self._cache: OrderedDict[tuple, tuple[Values, bytes, bytes]] = OrderedDict()
        self.cache_hits = 0
        self.cache_misses = 0
        # values of vocabulary fields that fell to the unknown row, per field (an item's once while the item
        # cache holds it, a cross's once per memoized group)
        self.vocabulary_unknown: dict[str, int] = {}
        # keys appended to the vocabulary fields with a capacity (offgraph.store.vocabulary_appends): the served
        # version's, read from its store, or those a stream trainer gives its new values (``grow``)
        self.appended = {
            f.name: AppendedKeys(f.name, f.appendable.start, f.capacity) for f in spec.fields if f.capacity
        }
        self._growing: set[str] = set()
        self._new_keys: dict[str, list[str]] = {}
        # Serving cross fields are computed once per distinct (request values, item value
        # sets) and memoized. A value-set id names one item field's value list; ids are
        # never reused (the intern table may be cleared, the counter is not), so a memo
        # key can never name another value set.
        self._item_pos = {f.name: j for j, f in enumerate(self._item)}
        self._vid_intern: dict[tuple, int] = {}
        self._vid_next = 0
        self._vid_limit = max(4 * item_cache_size, 100_000)
        self._memo_size = cross_memo_size
        self._cross_memo: list[dict] = [{} for _ in self._cross]
        self._cross_memo_len = [0] * len(self._cross)
        deps: dict[str, tuple[frozenset, frozenset]] = {}
        self._cross_deps: list[tuple[tuple[str, ...], np.ndarray]] = []
        for f in self._cross:
            req: set[str] = set()
            item: set[int] = set()  # positions among the item fields
            for x in f.inputs:
                if x in deps:
                    req |= deps[x][0]
                    item |= deps[x][1]
                elif x in self._item_pos:
                    item.add(self._item_pos[x])
                else:
                    req.add(x)
            deps[f.name] = (frozenset(req), frozenset(item))
            self._cross_deps.append((tuple(sorted(req)), np.array(sorted(item), dtype=np.int64)))
        # item fields a cross reads: only their values (and value-set ids) are kept in the item cache;
        # the others' cost ~2 KB an item for nothing (a spec without crosses keeps none)
        self._item_crossed = frozenset(int(j) for _, cols in self._cross_deps for j in cols)
        self._no_values = (None,) * len(self._item)  # the values of an entry no cross reads (shared)

    @property
    def crossed_item_fields(self) -> tuple[int, ...]:
        """Positions among the item fields of those a cross reads (their values are kept in item-cache entries)."""
        return tuple(sorted(self._item_crossed))

    # -- carrying the item cache over to the next version ---------------------------------
    def resize_item_cache(self, items: int) -> None:
        """Hold at most ``items`` items in the item cache from now on (the least recently used go at
        the next miss). A generator made without an item cache keeps none."""
        if isinstance(items, bool) or not isinstance(items, int) or items < 1:
            raise ValueError(f"items must be an int >= 1, got {items!r}")
        if self._cache_size > 0:
            self._cache_size = items

    def item_cache_state(self, limit: int | None = None) -> dict[str, Any]:
        """A copy of the item cache (its ``limit`` newest items at most), for
        :meth:`adopt_item_cache` of a generator of the same spec. Entries are never mutated once
        made, so the copy shares them; it is quick (the caller holds the lock that serving takes)."""
        # Read through the base dict's views: iterating the OrderedDict itself hashes every key again
        # (item keys are long tuples, whose hashes Python does not keep), holding the GIL for the whole
        # pass; the dict's entry table is walked in C with no hashing. Its order is the OrderedDict's,
        # because hits never reorder this cache (insertion order, FIFO).
        # Object arrays, not lists: NumPy arrays are not tracked by the cyclic GC, so the collections
        # that run while the next version loads do not walk every copied reference.
        # (What both cost: bench/results/scale-swap/README.md.)
        n = len(self._cache)
        first = n - (n if limit is None else min(n, limit))
        keys = np.fromiter(dict.keys(self._cache), dtype=object, count=n)[first:]
        entries = np.fromiter(dict.values(self._cache), dtype=object, count=n)[first:]
        return {
            "spec": self.spec.fingerprint(),
            "appended": self._appended_state(),
            "keys": keys,
            "entries": entries,
            "vid_next": self._vid_next,
        }

    def _appended_state(self) -> dict[str, tuple[str, ...]]:
        return {name: tuple(a.keys) for name, a in self.appended.items() if a.keys}

    def adopt_item_cache(self, state: dict[str, Any] | None, pace: Callable[[], None] | None = None) -> int:
        """Start from another generator's :meth:`item_cache_state` if it ran the same spec (the same
        raw item values then give the same ids); returns the items adopted (0 for another spec).
        A version that replaces one of the same spec then computes no item FG for the items its
        predecessor served recently. Built in chunks, ``pace()`` between them (a loader yielding to
        serving)."""
        if not state or state["spec"] != self.spec.fingerprint() or self._cache_size <= 0:
            return 0
        if state.get("appended", {}) != self._appended_state():  # the same values, other rows
            return 0
        keys, entries = state["keys"][-self._cache_size :], state["entries"][-self._cache_size :]
        cache: OrderedDict = OrderedDict()
        for s in range(0, len(keys), ADOPT_CHUNK):
            cache.update(zip(keys[s : s + ADOPT_CHUNK], entries[s : s + ADOPT_CHUNK]))
            if pace is not None:
                pace()
        self._cache = cache
        # value-set ids: the adopted entries keep theirs, and new ones are numbered after them (never
        # reused). The intern table is not copied (it is up to 4x the cache): a new item whose value
        # set an adopted one also has gets another id, which costs a memo miss, never a wrong cross.
        self._vid_intern = {}
        self._vid_next = max(self._vid_next, int(state["vid_next"]))
        # memoized crosses are keyed by value-set ids, which now mean the adopted ones
        self._cross_memo = [{} for _ in self._cross]
        self._cross_memo_len = [0] * len(self._cross)
        return len(keys)

    def release(self, pace: Callable[[], None] | None = None, chunk: int = RELEASE_CHUNK) -> int:
        """Empty the item cache, the cross memos and the value-set intern table ``chunk`` entries at a
        time, ``pace()`` between chunks; returns the entries dropped. The generator stays usable, with
        empty caches. A retired version's generator is emptied this way, because dropping it whole frees
        every entry in one deallocation that holds the GIL while the next version serves."""
        n = 0
        dicts: list[dict] = [self._cache, self._vid_intern, *self._cross_memo]
        for d in dicts:
            while d:
                for _ in range(min(chunk, len(d))):
                    d.popitem()  # from the end: O(1), no scan over the holes left at the front
                    n += 1
                if pace is not None:
                    pace()
        self._cross_memo_len = [0] * len(self._cross)
        return n

    # -- values ---------------------------------------------------------------------------
    def _values(
        self,
        fields: Sequence[FieldSpec],
        columns: Mapping[str, Sequence[Any]],
        n: int,
        known: dict[str, Values],
        bound: Bound | None = None,
    ) -> dict[str, Values]:
        """Values of ``fields`` (in order) from raw ``columns``; derived ops read ``known``.
        A ``keep_last`` field's values are cut to its last ``max_values`` (``value_limits.keep_last``),
        with or without ``bound``, before any field reads them. With ``bound`` (serving), each id /
        tokenize field is checked against its limits before and after its op (for an early refusal:
        ``transform`` counts every field's values exactly)."""
        for f in fields:
            try:
                if f.op in RAW_OPS:
                    col = columns.get(cast(str, f.input))  # a raw op's field has an input
                    if col is None:
                        col = [None] * n
                    checked = bound if f.op in LIST_OPS else None  # other ops give at most max_values
                    if checked is not None:
                        checked.raw(f, col)
                    vals = RAW_OPS[f.op](f.name, col, f.params)
                    if f.op in LIST_OPS:  # ``overflow: keep_last``: the cut, here for training and serving alike
                        vals = keep_last(f, vals)
                    if checked is not None:
                        checked.produced(f, vals)
                else:
                    vals = DERIVED_OPS[f.op](f.name, [known[x] for x in f.inputs], f.params)
            except TypeError as e:
                raise FeatureValueError(f"field '{f.name}': {e}") from None
            except FeatureValueError as e:
                if bound is None:
                    raise
                raise bound.locate(e) from None
            known[f.name] = vals
        return known

    def _ragged(self, f: FieldSpec, vals: Values) -> RaggedIds:
        lengths = np.fromiter((len(v) for v in vals), dtype=np.int64, count=len(vals))
        if f.vocabulary is None:
            ids = rows_of(chain.from_iterable(vals), self.hash, f.rows)
        else:  # no hashing: the vocabulary's rows, the unknown row for values it lacks (counted)
            strings = list(chain.from_iterable(vals))
            ids = f.vocabulary.rows_of(strings)
            if f.capacity:
                ids = self._appended_rows(f, strings, ids)
            unknown = int(np.count_nonzero(ids == UNKNOWN_ROW))
            if unknown:
                self.vocabulary_unknown[f.name] = self.vocabulary_unknown.get(f.name, 0) + unknown
        return RaggedIds(ids, _offsets(lengths))

    # -- keys appended to a served vocabulary (``capacity``) ---------------------------------
    def _appended_rows(self, f: FieldSpec, strings: list[str], ids: np.ndarray) -> np.ndarray:
        """``ids`` with the appended keys' rows; a growing field's other unknown values get the next free rows
        (first seen, first given) while its capacity lasts."""
        app = self.appended[f.name]
        lost = app.fill(strings, ids)
        if len(lost) and f.name in self._growing and app.free:
            new = list(dict.fromkeys(strings[i] for i in lost))[: app.free]
            self.append_keys(f.name, new)
            self._new_keys.setdefault(f.name, []).extend(new)
            app.fill(strings, ids)
        return ids

    def append_keys(self, field: str, keys: list[str]) -> None:
        """Give ``keys`` (values the field's vocabulary file lacks) the field's next free rows, as the store's
        appends record them. The item cache and the cross memos go: their ids may name the unknown row."""
        self.appended[field].extend(keys)
        self._cache = OrderedDict()
        self._cross_memo = [{} for _ in self._cross]
        self._cross_memo_len = [0] * len(self._cross)

    def grow(self, fields: Sequence[str]) -> None:
        """From now on the unknown values of these fields (with a capacity) take the next free rows, kept for
        :meth:`take_new_keys` (the stream trainer: each new id gets a row of its own, and the updater appends it
        to the served vocabulary)."""
        missing = sorted(set(fields) - set(self.appended))
        if missing:
            raise ValueError(f"fields {missing} have no vocabulary capacity to append keys to")
        self._growing = set(fields)

    @property
    def has_new_keys(self) -> bool:
        return bool(self._new_keys)

    def take_new_keys(self) -> dict[str, tuple[int, list[str]]]:
        """The keys given rows since the last call, per field: (the first one's row, keys in row order)."""
        out = {}
        for name, keys in self._new_keys.items():
            app = self.appended[name]
            out[name] = (app.next_row - len(keys), keys)
        self._new_keys = {}
        return out

    # -- training ---------------------------------------------------------------------------
    def transform_columns(
        self, columns: Mapping[str, Sequence[Any]], n: int, dense: bool = True, grow: bool = True
    ) -> FGBatch:
        """Every field for n rows given column-wise raw values (training, offline checks); ``dense``:
        also the numeric fields' values (their standardize statistics must be in the spec). ``grow``: False keeps
        the fields of :meth:`grow` from giving rows (a prediction, not a step: its new values stay unknown)."""
        known = self._values(self._fields, columns, n, {})
        growing = self._growing
        if not grow:
            self._growing = set()
        try:
            fields = tuple(self._ragged(f, known[f.name]) for f in self._fields)
        finally:
            self._growing = growing
        values = self.numeric_columns(columns, n) if dense else None
        return FGBatch(n, fields, (False,) * len(fields), values)

    def numeric_columns(self, columns: Mapping[str, Sequence[Any]], n: int, finished: bool = True) -> np.ndarray:
        """[n, k]: the numeric fields' model inputs (float32), or with ``finished`` False their values before
        standardize (float64, NaN where no value: what training computes statistics on)."""
        out = np.zeros((n, len(self._numeric)), np.float32 if finished else np.float64)
        for j, f in enumerate(self._numeric):
            col = columns.get(cast(str, f.input))  # a numeric field has an input
            col = [None] * n if col is None else col
            out[:, j] = numeric_values(f, col) if finished else pre_standardize(f, col)
        return out

    def finish_numeric(self, pre: np.ndarray) -> np.ndarray:
        """``numeric_columns(finished=False)`` -> the finished [n, k] float32 inputs (same maths as serving)."""
        out = np.zeros(pre.shape, np.float32)
        for j, f in enumerate(self._numeric):
            out[:, j] = finish(f, pre[:, j])
        return out

    def values_columns(self, columns: Mapping[str, Sequence[Any]], n: int) -> dict[str, Values]:
        """Generated value strings per field (for inspection and tests)."""
        return self._values(self._fields, columns, n, {})

    # -- serving ----------------------------------------------------------------------------
    def transform(
        self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], grouped: bool = False
    ) -> FGBatch:
        """One request + N candidates; request-scope fields computed once (n == 1, broadcast).

        Item-scope fields come from the per-item cache; a cross field is computed once
        per distinct (request values, values of the item fields it depends on) and
        memoized (same ids as ``transform_columns``). With ``grouped``, a cross field and an
        item field a cross reads come as their distinct value lists and each candidate's
        (``FGBatch.segment_of``): the lookups and pooling then run once per distinct list; else
        they are scattered to the candidates.
        """
        n = len(candidates)
        ignored = self.check_scopes(request, candidates)
        bound = Bound(self.max_request_values, _at_request)
        req_vals, out, req_used = self._request_part(request, bound)
        entries = self._entries(candidates, bound) if self._item else []
        dense = self._serving_numeric(request, candidates, n)
        return self._assemble(req_vals, out, req_used, entries, n, bound, grouped, dense, ignored)

    def transform_entries(
        self,
        request: Mapping[str, Any],
        entries: Sequence[tuple],
        item_numeric: np.ndarray | None,
        candidate_ignored: int,
        grouped: bool = False,
    ) -> FGBatch:
        """``transform`` of one request and candidates given as their :meth:`candidate_entries` (held by the
        caller between requests, keyed by the candidate as sent: ``offgraph.scoring.candidate_cache``), with
        ``item_numeric`` [n, k_item] (the entries' item-scope numeric values, stacked) and
        ``candidate_ignored`` (their ignored keys, summed): the same batch, and the same refusals of the
        request's own values and of the request's value budget."""
        n = len(entries)
        ignored = self.check_scopes(request, ()) + candidate_ignored
        bound = Bound(self.max_request_values, _at_request)
        req_vals, out, req_used = self._request_part(request, bound)
        dense = np.zeros((n, len(self._numeric)), np.float32)
        for k, (j, _) in enumerate(self._request_numeric(request, dense)):
            if item_numeric is not None:  # the entries carry one column per item-scope numeric field
                dense[:, j] = item_numeric[:, k]
        return self._assemble(req_vals, out, req_used, entries, n, bound, grouped, dense, ignored)

    def candidate_entries(self, candidates: Sequence[Mapping[str, Any]]) -> list[tuple]:
        """What :meth:`transform_entries` needs of each candidate, computed once: its item-cache entry (through
        the item cache), then the keys the spec does not read, then its item-scope numeric values (float32
        bytes, in ``spec.numeric`` order). Raises what ``transform`` raises for such a candidate (a
        ``ScopeError``, a value FG refuses, a row over a field's ``max_values``)."""
        self.check_scopes({}, candidates)
        keys = self._item_keys
        ignored = [len(c.keys() - keys) for c in candidates]
        bound = Bound(None, lambda r: f"candidates[{r}]")
        entries = self._entries(candidates, bound) if self._item else [((), b"", b"")] * len(candidates)
        item_num = [f for f in self._numeric if f.scope != "request"]
        num = np.zeros((len(candidates), len(item_num)), np.float32)
        for j, f in enumerate(item_num):
            num[:, j] = numeric_values(f, [c.get(cast(str, f.input)) for c in candidates])
        return [(*e, ig, num[i].tobytes()) for i, (e, ig) in enumerate(zip(entries, ignored))]

    def _request_part(self, request: Mapping[str, Any], bound: Bound) -> tuple[dict[str, Values], dict, int]:
        """(values, ids per request field, values counted) of the request-scope fields, computed once."""
        req_cols = {cast(str, f.input): [request.get(cast(str, f.input))] for f in self._request}
        req_vals = self._values(self._request, req_cols, 1, {}, bound)
        out: dict[str, RaggedIds] = {f.name: self._ragged(f, req_vals[f.name]) for f in self._request}
        req_used = sum(len(out[f.name].ids) for f in self._request)
        bound.count(req_used)
        return req_vals, out, req_used

    def _assemble(
        self,
        req_vals: dict[str, Values],
        out: dict[str, RaggedIds],
        req_used: int,
        entries: Sequence[tuple],
        n: int,
        bound: Bound,
        grouped: bool,
        dense: np.ndarray,
        ignored: int,
    ) -> FGBatch:
        """The batch of a request's fields from its request part and one item-cache entry per candidate
        (their first three parts: the values a cross reads, the ids, their counts and value-set ids)."""
        Fi = len(self._item)
        seg_of: dict[str, np.ndarray] = {}
        if Fi:
            meta = np.frombuffer(b"".join(map(itemgetter(2), entries)), dtype=np.int64).reshape(n, 2 * Fi)
            lengths = meta[:, :Fi]
            vsets = _ValueSets(meta[:, Fi:])
            bound.count(req_used + int(lengths.sum()))  # the misses were counted on their own: now all
            flat = np.frombuffer(b"".join(map(itemgetter(1), entries)), dtype=np.int64)
            starts = np.zeros((n, Fi), dtype=np.int64)
            if n:  # start of each (candidate, field) in flat: exclusive cumsum in row-major order
                np.cumsum(lengths.reshape(-1)[:-1], out=starts.reshape(-1)[1:])
            for j, f in enumerate(self._item):
                if grouped and j in self._item_crossed and n:  # its value set has an id: one segment per set
                    _, rep, inv = vsets.distinct((j,))
                    out[f.name] = _ragged_gather(flat, starts[rep, j], lengths[rep, j])
                    seg_of[f.name] = inv
                else:
                    out[f.name] = _ragged_gather(flat, starts[:, j], lengths[:, j])
        else:
            vsets = _ValueSets(np.zeros((n, 0), np.int64))
        groups: dict[str, tuple[np.ndarray, list[tuple]]] = {}
        for c, f in enumerate(self._cross):
            rag, inv = self._cross_field(c, f, req_vals, entries, vsets, groups)
            bound.spend(int(rag.lengths[inv].sum()))
            if grouped:
                out[f.name], seg_of[f.name] = rag, inv
            else:
                out[f.name] = _per_row(rag, inv)
        fields = tuple(out[f.name] for f in self._fields)
        segment_of = tuple(seg_of.get(f.name) for f in self._fields) if seg_of else None
        return FGBatch(n, fields, tuple(f.scope == "request" for f in self._fields), dense, ignored, segment_of)

    def _serving_numeric(self, request, candidates, n: int) -> np.ndarray:
        dense = np.zeros((n, len(self._numeric)), np.float32)
        for j, f in self._request_numeric(request, dense):
            try:
                dense[:, j] = numeric_values(f, [c.get(f.input) for c in candidates])
            except FeatureValueError as e:
                raise e.at(f"candidates[{e.row}]") from None
        return dense

    def _request_numeric(self, request: Mapping[str, Any], dense: np.ndarray) -> list[tuple[int, FieldSpec]]:
        """Fill ``dense``'s request-scope numeric columns from ``request``; returns the item-scope ones
        (column, field), in ``spec.numeric`` order."""
        item = []
        for j, f in enumerate(self._numeric):
            if f.scope != "request":
                item.append((j, f))
                continue
            try:
                dense[:, j] = numeric_values(f, [request.get(cast(str, f.input))])[0]
            except FeatureValueError as e:
                raise e.at("request") from None
        return item

    def check_scopes(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> int:
        """Refuse (ScopeError) a request-only input inside a candidate, or an item-only input in the request
        (the model would never read it there: the request would score silently wrong); returns the number of
        keys the spec does not read at all (ignored, by design: counted for the metrics)."""
        extra = request.keys() - self._req_keys
        ignored = 0
        if extra:
            wrong = sorted(extra & self._item_only)
            if wrong:
                raise ScopeError(wrong[0], "request", "item")
            ignored = len(extra)
        # the union of all candidates' keys in one C-level pass; per candidate only when some key is extra
        extra = set().union(*candidates) - self._item_keys
        if extra:
            misplaced = extra & self._request_only
            for i, c in enumerate(candidates):
                if misplaced and not misplaced.isdisjoint(c):
                    raise ScopeError(sorted(misplaced.intersection(c))[0], f"candidates[{i}]", "request")
                ignored += len(extra.intersection(c))
        return ignored

    def _cross_field(
        self,
        c: int,
        f: FieldSpec,
        req_vals: dict[str, Values],
        entries: Sequence[tuple],
        vsets: _ValueSets,
        groups: dict[str, tuple[np.ndarray, list[tuple]]],
    ) -> tuple[RaggedIds, np.ndarray]:
        """Cross field ``f`` for all candidates: one computation per distinct group of
        the value sets it depends on, through the memo. Returns (the ids of each group, the group of
        each candidate [n]); ``groups[f.name]`` gets (group of each candidate, each group's memo entry: its
        values, then its ids) for crosses built on ``f``."""
        req_names, item_cols = self._cross_deps[c]
        gkeys, rep, inv = vsets.distinct(tuple(item_cols.tolist()))
        req_key = tuple(tuple(req_vals[x][0]) for x in req_names)
        table = self._cross_memo[c]
        memo = table.get(req_key)
        if memo is None:
            memo = {}
            if self._memo_size > 0:
                if self._cross_memo_len[c] >= self._memo_size:
                    table.clear()
                    self._cross_memo_len[c] = 0
                table[req_key] = memo
                self._cross_memo_len[c] += 1
        results: list[Any] = [memo.get(k) for k in gkeys]
        missing = [g for g, r in enumerate(results) if r is None]
        if missing:
            reps = rep[missing].tolist()
            parts = []
            for x in f.inputs:
                if x in groups:
                    ginv, gvals = groups[x]
                    parts.append([gvals[ginv[i]][:-1] for i in reps])
                elif x in self._item_pos:
                    j = self._item_pos[x]
                    parts.append([entries[i][0][j] for i in reps])
                else:
                    parts.append(req_vals[x] * len(reps))
            try:
                vals = DERIVED_OPS[f.op](f.name, parts, f.params)
            except TypeError as e:
                raise FeatureValueError(f"field '{f.name}': {e}") from None
            rag = self._ragged(f, vals)
            if self._memo_size > 0 and self._cross_memo_len[c] + len(missing) > self._memo_size:
                table.clear()
                memo = table[req_key] = {}
                self._cross_memo_len[c] = 1
            for m, g in enumerate(missing):
                # flat (the values, then the ids): untracked by the first collection that sees it
                results[g] = (*vals[m], rag.ids[rag.offsets[m] : rag.offsets[m + 1]])
                memo[gkeys[g]] = results[g]
            self._cross_memo_len[c] += len(missing) if self._memo_size > 0 else 0
        groups[f.name] = (inv, results)
        ids = list(map(itemgetter(-1), results))
        glen = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        gflat = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        return RaggedIds(gflat, _offsets(glen)), inv

    def _entries(self, candidates: Sequence[Mapping[str, Any]], bound: Bound) -> list[tuple]:
        """One item-cache entry per candidate (through the cache when it is on)."""
        n = len(candidates)
        if self._cache_size <= 0:
            return self._new_entries(candidates, range(n), bound)
        inputs = self._item_inputs
        cache = self._cache
        keys = fast_keys([[c.get(k) for c in candidates] for k in inputs])
        entries: list
        try:
            if keys is None:
                raise TypeError
            entries = list(map(cache.get, keys))
        except TypeError:  # some candidate's key needs the per-value checks (or the exact key)
            keys, entries = self._keyed(candidates)
        miss_keys: dict[tuple, int] = {}
        if None in entries:
            for i, e in enumerate(entries):
                if e is None:
                    miss_keys.setdefault(keys[i], i)
        self.cache_misses += len(miss_keys)
        self.cache_hits += n - len(miss_keys)
        if miss_keys:
            first = list(miss_keys.values())
            for i, e in zip(first, self._new_entries(candidates, first, bound)):
                cache[keys[i]] = e
            entries = [e if e is not None else cache[k] for e, k in zip(entries, keys)]
            while len(cache) > self._cache_size:
                cache.popitem(last=False)
        return entries

    def _keyed(self, candidates: Sequence[Mapping[str, Any]]) -> tuple[list[tuple], list]:
        """(item-cache key, cached entry or None) of each candidate, one candidate at a time."""
        inputs = self._item_inputs
        cache = self._cache
        keys = []
        entries: list = []
        for cand in candidates:
            try:
                k = _fast_key(map(cand.get, inputs))
                e = cache.get(k)
            except TypeError:  # a nested or non-plain value: the slow, exact key
                k = tuple(freeze_value(cand.get(c)) for c in inputs)
                e = cache.get(k)
            keys.append(k)
            entries.append(e)
        return keys, entries

    def _new_entries(self, candidates: Sequence[Mapping[str, Any]], which, bound: Bound) -> list[tuple]:
        """Item fields of ``candidates[i] for i in which``, as cache entries (checked against ``bound``)."""
        m = len(which)
        cols = {c: [candidates[i].get(c) for i in which] for c in self._item_inputs}
        bound.where = lambda r: f"candidates[{which[r]}]"
        vals = self._values(self._item, cols, m, {}, bound)
        per_field = [vals[f.name] for f in self._item]
        rags = [self._ragged(f, vals[f.name]) for f in self._item]
        if len(self._vid_intern) > self._vid_limit:
            self._vid_intern.clear()
        intern = self._vid_intern
        crossed = self._item_crossed
        Fi = len(per_field)
        meta = np.zeros((m, 2 * Fi), dtype=np.int64)  # per entry: ids per item field, value-set id per field
        for j, rg in enumerate(rags):
            meta[:, j] = np.diff(rg.offsets)
        out = []
        for r in range(m):
            values: Any = self._no_values
            if crossed:
                values = np.empty(Fi, dtype=object)
                for j in crossed:
                    fvals = per_field[j][r]
                    key = (j, *fvals)  # flat: see below
                    v = intern.get(key)
                    if v is None:
                        v = intern[key] = self._vid_next
                        self._vid_next += 1
                    meta[r, Fi + j] = v
                    values[j] = tuple(fvals)
            # ids as bytes: a request joins its candidates' in one ``bytes.join`` (no array per candidate)
            ids = b"".join([rg.ids[rg.offsets[r] : rg.offsets[r + 1]].tobytes() for rg in rags])
            # An entry is a tuple of objects the cyclic GC does not track (arrays, bytes, a shared tuple
            # of Nones): the collector untracks it the first time it sees it, and no collection walks
            # the cached items again. A fresh tuple inside it would keep it tracked one collection
            # more (the inner tuple is examined after the outer one), and every collection of the next
            # generation would walk each item the cache took since (tens of ms at a steady miss rate).
            out.append((values, ids, meta[r].tobytes()))
        return out
