"""The join at serving time: fill a request's raw inputs from the model's feature tables, before FG.

``{"request": {"user_id": 196}, "candidates": [{"movie_id": 242}, ...]}`` becomes the full
request: the request-scope tables (a user profile) are read once, with the request's key; the
item-scope tables (the catalog) from the table's record cache (``offgraph.feature_tables.record_cache``: records
held decoded, cleared by a catch-up that brought a change) and ONE batched multi_get of the keys it does
not hold.

Rules (offgraph/server/README.md, "Request forms"):

- a value sent in the body overrides the stored one, key by key: a key present in the body
  is used as sent, even null ("no value"); a key absent from the body is filled from the table;
- a body that already carries every column of a table (sent, even null, or filled by an earlier table)
  has nothing to fill from it: its key is looked up (the unknown count below) but its row is not read,
  so a stored row it would not use is never judged (never counted unusable);
- an unknown key (no row) fills nothing (no value, as a missing feature always is); the
  response counts the candidates with an unknown key (``unknown_candidates``) and says whether
  the request's own row was unknown (``unknown_request``); a candidate without the key is not
  counted (nothing was looked up);
- a scope no table fills cannot be sent ids-only: a request that sends only a key where the model
  reads more and has no table keyed by it (every candidate holding only ``item_key``, or the
  request holding only ``split_key``) is refused (``IdsOnlyError``, a 422) rather than scored
  silently with no features (a model without tables, or with an item table and no user table).
  A full request with some values missing still scores, as before.

- a stored row that FG refuses (a value written around the writers' checks: straight through
  ``FeatureDB.write``, or before they existed) is never the caller's 422: when FG refuses a joined
  request, :meth:`FeatureJoin.screen` checks the values the tables filled in with FG's own rules
  (``offgraph.features.value_limits.value_errors``) and joins again with each such row left out, as if its
  key had no row (an unknown key, counted as one); the row is counted
  (``offgraph_unusable_feature_rows_total``) and logged, once a minute at most per table. The row's
  value is remembered by its hash, so later requests naming it leave it out at the join (one dict
  lookup per candidate while a table has such rows; none otherwise) instead of failing FG first. A
  request whose own values FG refuses is still a 422. Requests naming other keys never take this path.

FG's item cache is keyed by the candidate's raw values AFTER the join, so a changed item row is
a new cache key: its hashed rows are recomputed, nothing to invalidate.

Follow mode: the tables are RocksDB secondaries, caught up by one daemon thread every
``catch_up_s`` (0.2 s: a catch-up of such a small DB costs about a millisecond, and runs only when the writer's
files moved: ``FeatureDB.catch_up``), so a streamed feature row is served within that bound (plus the
updater's own latency).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import msgspec

from offgraph.feature_tables.db import (
    TABLE_FILE,
    FeatureDB,
    FeatureTableError,
    decode_row,
    row_key,
    row_keys,
    table_dir,
)
from offgraph.feature_tables.record_cache import NO_ROW, Entry, RecordCache, decode_entries
from offgraph.features.fg import FeatureValueError
from offgraph.features.spec import FeatureSpec
from offgraph.features.value_limits import value_errors

log = logging.getLogger("offgraph.server")

FOLLOW_CATCH_UP_S = 0.2
UNUSABLE_LOG_S = 60.0
"""At most one log line per table this often about stored rows FG refuses (the count is on /metrics)."""
BAD_ROWS_KEPT = 4096
"""Unusable rows remembered per table (by their value's hash; the memory is cleared when it would hold more)."""


def _key_text(k: bytes) -> str:
    """A record key's key value, for the log (``row_key``: a prefix byte, then the key's text)."""
    return k[1:].decode("utf-8", "replace")


class IdsOnlyError(FeatureValueError):
    """A request that sends only keys to a model that cannot fill the rest (a 422)."""


@dataclass(frozen=True)
class Joined:
    request: Mapping[str, Any]
    candidates: Sequence[Mapping[str, Any]]
    unknown_candidates: int = 0
    unknown_request: bool = False
    unusable: int = 0  # stored rows left out because FG refuses their values (FeatureJoin.screen)
    lacking: Sequence[bool] = ()  # per candidate (with item tables): its key was looked up and has no row
    # per item table (FeatureJoin.item_tables' order), per candidate: the stored record merged into it (the record
    # cache's own bytes object, not a copy), None where nothing was (no row, a row left out, a body with every column)
    records: Sequence[Sequence[bytes | None]] = ()
    # the candidates as FG saw them, by reference (JoinedCandidates), where ``candidates`` are the ones sent (the
    # scorer's candidate cache): what the served log writes (``as_seen``)
    seen: JoinedCandidates | None = None

    @property
    def as_seen(self) -> Any:
        """The candidates as FG saw them: ``seen`` where the scorer set it, else ``candidates`` (already so)."""
        return self.candidates if self.seen is None else self.seen


def _merged(cand: Mapping[str, Any], row: Mapping[str, Any], columns: Sequence[str], whole: bool) -> dict[str, Any]:
    """``cand`` with ``row``'s values of ``columns`` it lacks (the body's values win), a new dict: the held row and the
    caller's dict are never changed. ``whole``: every column of the row is one of ``columns`` (merged in one call)."""
    if whole:
        return {**row, **cand}
    merged = dict(cand)
    for col in columns:
        if col not in merged and col in row:
            merged[col] = row[col]
    return merged


class JoinedCandidates:
    """A request's candidates as the join gave them to FG, held as references until asked for (the served log's
    writer thread, for a sampled request only): the candidates as sent (``sent``: each one's dict, decoded when
    asked) and, per candidate, the stored records the join merged into it (``records(i)``: one per item table, in
    ``join.item_tables``' order, None where none was). A candidate the scorer's candidate cache held was not joined
    by its request: its records are the ones its cache entry kept from the join that made it, which are the table's
    state that request scored with (the cache is emptied when a table changes: ``FeatureJoin.generation``), never a
    read of the table now. Nothing is decoded or merged on the request path."""

    __slots__ = ("sent", "records", "join")

    def __init__(self, sent: Any, records: Callable[[int], Sequence[bytes | None]], join: FeatureJoin):
        self.sent, self.records, self.join = sent, records, join

    def __len__(self) -> int:
        return len(self.sent)

    def dicts(self) -> list[dict[str, Any]]:
        """Every candidate as FG saw it: its dict as sent with each record merged as ``FeatureJoin.fill`` merged it."""
        join = self.join
        sent = self.sent.dicts() if hasattr(self.sent, "dicts") else self.sent
        out = []
        for i, cand in enumerate(sent):
            for t, v in zip(join.item_tables, self.records(i)):
                if v is not None:
                    cand = _merged(cand, cast(dict, decode_row(v)), t.columns, join._whole.get(t.name, False))
            out.append(cand)
        return out


def ids_only_checks(spec: FeatureSpec) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """``(scope, key, other inputs of the scope)`` for each scope whose key no table of ``spec`` fills
    and that reads more than the key: what :func:`check_not_ids_only` looks at (once per version)."""
    filled = {t.key for t in spec.tables}
    out = []
    for scope, key in (("item", spec.item_key), ("request", spec.split_key)):
        if key is None or key in filled:
            continue
        others = tuple(c for c in spec.raw_inputs(scope) if c != key)
        if others:
            out.append((scope, key, others))
    return tuple(out)


def check_not_ids_only(checks, name: str, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> None:
    """``IdsOnlyError`` when the body sends only a key, in a scope that no table fills
    (``checks``: :func:`ids_only_checks` of the spec)."""
    for scope, key, others in checks:
        rows = candidates if scope == "item" else (request,)
        if rows and all(key in r and not any(c in r for c in others) for r in rows):
            where = "every candidate holds" if scope == "item" else "the request holds"
            raise IdsOnlyError(
                f"model '{name}' has no feature table keyed by '{key}', but {where} only '{key}': it would be "
                f"scored with none of its {scope} features {list(others)}. Send them (GET /v1/models/{name} lists "
                f"`inputs`), or serve a version whose spec declares `tables` (ids-only requests)"
            )


def ids_only(spec: FeatureSpec, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]):
    """The ids-only form of a full request: every column a table of ``spec`` fills is left out
    (the keys, and inputs no table holds, stay)."""
    req_cols = {c for t in spec.tables if t.scope == "request" for c in t.columns}
    item_cols = {c for t in spec.tables if t.scope == "item" for c in t.columns}
    return (
        {k: v for k, v in request.items() if k not in req_cols},
        [{k: v for k, v in c.items() if k not in item_cols} for c in candidates],
    )


class FeatureJoin:
    """The feature tables of one version, opened "r" (a snapshot) or "follow" (caught up in the
    background)."""

    def __init__(
        self,
        version_dir: str | Path,
        spec: FeatureSpec,
        mode: str = "r",
        catch_up_s: float = FOLLOW_CATCH_UP_S,
        record_cache_bytes: int = 0,
    ):
        """``record_cache_bytes``: what the item tables' records held in process may count, all tables together
        (``offgraph.feature_tables.record_cache``; 0: every request reads its candidates' records)."""
        self.spec = spec
        self._stop = threading.Event()
        self._thread = None
        self.dbs: dict[str, FeatureDB | None] = {}
        self._db_mode = "follow" if mode == "follow" else "r"
        self._dirs = {t.name: table_dir(Path(version_dir).parent, t.name) for t in spec.tables}
        self._whole: dict[str, bool] = {}
        self._columns = {t.name: frozenset(t.columns) for t in spec.tables}
        try:
            for t in spec.tables:
                self._open(t)
        except FeatureTableError:
            self.close()
            raise
        self.request_tables = [t for t in spec.tables if t.scope == "request"]
        self.item_tables = [t for t in spec.tables if t.scope == "item"]
        # the item tables' records held (a request table is read once a request: nothing to gain)
        self._caches = {t.name: RecordCache(0) for t in self.item_tables}
        self.resize_cache(record_cache_bytes)
        self._marks = {name: db.change_mark() for name, db in self.dbs.items() if db is not None}
        self.catch_ups = 0
        # moves after every catch-up that changed an item table (its record cache cleared first) and when a missing
        # one appears: what a request joined under another generation may be older (offgraph.scoring.candidate_cache)
        self.generation = 0
        self._logged: dict[str, tuple[float, int]] = {}  # table -> (last log time, rows left out since)
        self._bad: dict[str, dict[bytes, tuple[int, str, str]]] = {}  # table -> record key -> (hash, key, why)
        self._log_lock = threading.Lock()
        if self._db_mode == "follow" and spec.tables:
            self.catch_up_s = float(catch_up_s)
            self._thread = threading.Thread(target=self._follow, name="feature-tables-follow", daemon=True)
            self._thread.start()

    def _open(self, t) -> None:
        """Open table ``t``; a table never created (no directory: a version copied without its model's
        ``offgraph/features/``) is served as empty, every key unknown, until it appears (follow mode: looked for
        at each catch-up) rather than refusing the version. A table that exists but fails to open is an
        error (FeatureTableError)."""
        path = self._dirs[t.name]
        if not (path / TABLE_FILE).exists():
            if t.name not in self.dbs:
                log.warning(
                    "feature table %s is missing (%s): every %s key is unknown until it is created "
                    "(offgraph features load, or offgraph export)",
                    t.name,
                    path,
                    t.key,
                )
            self.dbs[t.name] = None
            return
        db = FeatureDB(path, self._db_mode)
        self.dbs[t.name] = db
        # rows of a table whose columns on disk are this spec's (or fewer) can be merged whole
        self._whole[t.name] = set(db.info["columns"]) <= set(t.columns)

    def _records(self, name: str, keys: list) -> list:
        """The stored records of record ``keys``, undecoded (one multi_get); None for no row."""
        db = self.dbs.get(name)
        return [None] * len(keys) if db is None else db.get_raw(keys)

    def _item_entries(self, name: str, keys: list) -> list[Entry]:
        """An ``Entry`` (record, decoded row) per record key of item table ``name`` (``NO_ROW`` for a key of None
        or without a row): those its record cache holds, the rest read in one multi_get and decoded."""
        db = self.dbs.get(name)
        if db is None:
            return [NO_ROW] * len(keys)

        def fetch(ks: list) -> list[Entry]:
            return decode_entries(db.get_raw(ks), decode_row)

        cache = self._caches[name]
        if None not in keys:
            return cache.read(keys, fetch)
        got = iter(cache.read([k for k in keys if k is not None], fetch))
        return [NO_ROW if k is None else next(got) for k in keys]

    def resize_cache(self, record_cache_bytes: int) -> None:
        """Bound the item tables' record caches anew (``record_cache_bytes`` all together, shared equally)."""
        if isinstance(record_cache_bytes, bool) or not isinstance(record_cache_bytes, int) or record_cache_bytes < 0:
            raise ValueError(f"record_cache_bytes must be an int >= 0, got {record_cache_bytes!r}")
        for c in self._caches.values():
            c.resize(record_cache_bytes // len(self._caches))

    @property
    def cache_bytes(self) -> int:
        """Bytes the record caches count now (``offgraph.feature_tables.record_cache``)."""
        return sum(c.nbytes for c in self._caches.values())

    def _rows(self, name: str, keys: list, records: list, found: list) -> list:
        """The rows of ``records`` (those of record ``keys``), None for a row known to be unusable (:meth:`screen`
        cached its value's hash: a rewritten row is read again) and for a record that cannot be decoded; each
        such row goes into ``found``."""
        bad = self._bad.get(name)
        if not bad:  # the usual case: no unusable row met in this table
            try:
                return list(map(decode_row, records))
            except msgspec.DecodeError:  # a record that is not one (written around the writer): row by row
                bad = {}
        out: list[Any] = []
        for k, v in zip(keys, records):
            known = bad.get(k) if v is not None else None
            if known is not None and known[0] == hash(v):
                found.append((name, known[1], known[2]))
                out.append(None)
                continue
            try:
                out.append(decode_row(v))
            except msgspec.DecodeError as e:  # unusable as well: scored as an unknown key, counted, logged
                found.append((name, _key_text(k), f"the stored record cannot be decoded ({e})"))
                out.append(None)
        return out

    def fill(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> Joined:
        """The request and candidates with what the tables hold filled in (module docstring)."""
        found: list[tuple[str, Any, str]] = []  # rows left out as unusable: (table, key, why)
        unknown_request = False
        if self.request_tables:
            request = dict(request)
            for t in self.request_tables:
                if t.key not in request:
                    continue
                k = row_key(request[t.key])
                v = self._records(t.name, [k])[0]
                if v is None:
                    unknown_request = unknown_request or k is not None
                    continue
                if self._columns[t.name] <= request.keys():  # the body carries every column: nothing to read
                    continue
                row = self._rows(t.name, [k], [v], found)[0]
                if row is None:
                    unknown_request = True
                    continue
                for c in t.columns:
                    if c not in request and c in row:
                        request[c] = row[c]
        unknown = 0
        lacking: list[bool] = []
        records: list[list[bytes | None]] = []
        if self.item_tables:
            out = list(candidates)  # a candidate is copied only when a row is merged into it
            lacking = [False] * len(out)
            for t in self.item_tables:
                keys = row_keys([c.get(t.key) for c in candidates])  # None where the key is absent: no lookup
                entries = self._item_entries(t.name, keys)
                merged_records: list[bytes | None] = [None] * len(out)
                records.append(merged_records)
                cols = self._columns[t.name]
                whole = self._whole.get(t.name, False)
                bad = self._bad.get(t.name)  # rows known to be unusable, by their record's hash (screen)
                for i, (k, (v, row)) in enumerate(zip(keys, entries)):
                    if v is None:
                        if k is not None:
                            lacking[i] = True
                        continue
                    cand = out[i]
                    if cols <= cand.keys():  # the body carries every column: nothing to read
                        continue
                    if type(row) is str:  # the record cannot be decoded: scored as an unknown key, counted, logged
                        found.append((t.name, _key_text(cast(bytes, k)), row))
                        lacking[i] = True
                        continue
                    if bad and (known := bad.get(cast(bytes, k))) is not None and known[0] == hash(v):
                        found.append((t.name, known[1], known[2]))
                        lacking[i] = True
                        continue
                    out[i] = _merged(cand, row, t.columns, whole)
                    merged_records[i] = v
            unknown = sum(lacking)
            candidates = out
        if found:
            self._log_unusable(found)
        return Joined(request, candidates, unknown, unknown_request, len(found), lacking, records)

    def screen(
        self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], joined: Joined
    ) -> Joined | None:
        """After FG refused ``joined`` (the :meth:`fill` of the body ``request`` / ``candidates``): the join
        again with every stored row whose filled-in values FG refuses left out (unknown); None when no
        stored value is at fault (the body's own values are: the caller's 422). Only values the tables
        filled are checked, with FG's rules (``value_errors``), all rows at once. Such a row's value is
        remembered by its hash (``BAD_ROWS_KEPT`` per table), so that later requests naming it leave it out
        at the join without failing FG first; a rewritten row has another hash and is read again."""
        suspects: dict[str, list[bytes]] = {}
        for t, mine, theirs in [(t, [request], [joined.request]) for t in self.request_tables] + [
            (t, candidates, joined.candidates) for t in self.item_tables
        ]:
            idx = [i for i, c in enumerate(mine) if t.key in c]
            filled = {c: [None if c in mine[i] else theirs[i].get(c) for i in idx] for c in t.columns}
            for b in value_errors(
                self.spec, {c: v for c, v in filled.items() if any(x is not None for x in v)}, len(idx)
            ):
                key = row_key(mine[idx[b.row]][t.key])
                if key is not None:  # it was looked up, so it has a record key
                    suspects.setdefault(t.name, []).append(key)
        if not suspects:
            return None
        for name, keys in suspects.items():  # read again: keep the hash of the value that is bad NOW
            t = next(x for x in self.spec.tables if x.name == name)
            bad = self._bad.setdefault(name, {})
            if len(bad) + len(keys) > BAD_ROWS_KEPT:
                bad.clear()
            db = self.dbs[name]
            if db is None:  # (a table with suspects filled values: it is open)
                continue
            for k, v in zip(keys, db.get_raw(keys)):
                try:
                    row = decode_row(v)
                except msgspec.DecodeError:  # rewritten meanwhile into a record fill() leaves out
                    continue
                errs = [] if row is None else value_errors(self.spec, {c: [row.get(c)] for c in t.columns}, 1)
                if errs:
                    bad[k] = (hash(v), _key_text(k), str(errs[0]))
        return self.fill(request, candidates)

    def _log_unusable(self, found: list[tuple[str, Any, str]]) -> None:
        now = time.monotonic()
        with self._log_lock:
            for name in sorted({f[0] for f in found}):
                n = sum(1 for f in found if f[0] == name)
                last, since = self._logged.get(name, (-UNUSABLE_LOG_S, 0))
                if now - last < UNUSABLE_LOG_S:
                    self._logged[name] = (last, since + n)
                    continue
                self._logged[name] = (now, 0)
                key, why = next((k, w) for t, k, w in found if t == name)
                t = next(x for x in self.spec.tables if x.name == name)
                log.warning(
                    "feature table %s: a stored row the server cannot use, scored as unknown (%s=%r: %s)%s; "
                    "replace it with `offgraph features load` or a feature delta",
                    name,
                    t.key,
                    key,
                    why,
                    f" [{since + n} such rows in the last {now - last:.0f} s]" if since else "",
                )

    def _follow(self) -> None:
        tables = {t.name: t for t in self.spec.tables}
        while not self._stop.wait(self.catch_up_s):
            for name, db in list(self.dbs.items()):
                try:
                    if db is None:
                        self._open(tables[name])
                        if self.dbs.get(name) is not None and name in self._caches:
                            self.generation += 1
                    else:
                        db.catch_up()
                        mark = db.change_mark()
                        if mark != self._marks.get(name) and name in self._caches:
                            self._caches[name].clear()  # after the catch-up: a read from now on is of the new state
                            self.generation += 1
                        self._marks[name] = mark
                except Exception as e:  # noqa: BLE001 - keep following; the next round retries
                    log.warning("feature table %s: catch-up failed: %s", name, e)
            self.catch_ups += 1

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for db in self.dbs.values():
            if db is not None:
                db.close()
        self.dbs = {}
