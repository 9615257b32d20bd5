"""The library scorer: THE request path. The HTTP server wraps it and adds nothing to the maths.

    from offgraph.scoring.scorer import load
    scorer = load("models/movielens")               # newest complete version
    ctr = scorer.score(request, candidates)          # float32 [N]: CTRs (scorer.score_kind "ctr"), or
                                                     # ranking scores ("ranking": a listwise model uncalibrated)

(feature tables: fill what the body did not send, ``offgraph/feature_tables/join.py``) -> FG -> unique
keys -> row cache -> store read of the misses -> pool (a request field once) -> one signature call
(the dense head's ``split`` signature, the request's part of it computed once, when the version has
it; else ``serving_default`` on [N, F, D] and [N, F]) -> calibration.

``store_mode="follow"`` opens the store as a RocksDB secondary of the live writer (the
streaming updater) and starts one daemon thread (``offgraph.store.follower``) that, every
``follow_interval_s``, maps the new epochs of the writer's feed of applied rows (looked up
before the row cache), and catches the RocksDB secondary up every ``catch_up_s`` only (a
catch-up holds the GIL for milliseconds), then drops the epochs it covers (invalidating
their keys in the row cache).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from offgraph.calibration import calibrate, score_kind
from offgraph.feature_tables.join import FeatureJoin, Joined, JoinedCandidates, check_not_ids_only, ids_only_checks
from offgraph.features.fg import FeatureGenerator, FeatureValueError
from offgraph.features.segment import check_segmenters
from offgraph.features.vocabulary import VOCABULARY_UNKNOWN
from offgraph.modeldir.manifest import (
    ModelDirError,
    check_negative_rate,
    complete_versions,
    sampled_negative_rate,
    training_loss,
)
from offgraph.modeldir.version import ModelVersion
from offgraph.scoring.batch import Segments, batch_keys, pool_rows, read_through_cache
from offgraph.scoring.candidate_cache import LACKING, ONLY_KEY, RECORDS, CandidateCache
from offgraph.scoring.memory_budget import CANDIDATE_BYTES, FG_ITEM_BYTES, JOIN_RECORD_BYTES
from offgraph.scoring.numpy_head import NumpyHead, checked_head, default_max_rows, read_weights
from offgraph.scoring.raw_candidates import RawCandidates
from offgraph.scoring.read_metrics import STORE_READ_SECONDS
from offgraph.scoring.signature_call import SignatureCall
from offgraph.store import RowCache
from offgraph.store.feed import file_bytes as feed_file_bytes
from offgraph.store.follower import NOT_FOLLOWING, Activity, Follower
from offgraph.store.keys import BIAS_KEY, BIAS_ROW, BIAS_TABLE, ROW_BITS, ROW_LIMIT
from offgraph.store.vocabulary_appends import read_appended


class Scorer:
    """One loaded model version. Thread-safe for concurrent ``score`` calls."""

    def __init__(
        self,
        version_dir: str | Path,
        *,
        store_mode: str = "r",
        item_cache_size: int = 100_000,
        block_cache_mb: int | None = None,
        row_cache_mb: float = 0.0,
        follow_interval_s: float = 0.05,
        catch_up_s: float = 30.0,
        verify: bool = True,
        max_request_values: int | None = None,
        store_statistics: bool = False,
        pace: Callable[[], None] | None = None,
        direct_reads: bool | None = None,
        parallel_reads: bool = True,
        numpy_head_max_rows: int | None = None,
    ):
        if isinstance(row_cache_mb, bool) or not isinstance(row_cache_mb, (int, float)) or row_cache_mb < 0:
            raise ValueError(f"row_cache_mb must be a number >= 0, got {row_cache_mb!r}")
        if (
            isinstance(follow_interval_s, bool)
            or not isinstance(follow_interval_s, (int, float))
            or not follow_interval_s > 0
        ):
            raise ValueError(f"follow_interval_s must be a number > 0, got {follow_interval_s!r}")
        self.version_dir = Path(version_dir)
        # a request's store reads split over the read pool (a disk serves several at once); False: one
        # multi_get per shard on the scoring thread (a store in the page cache: its reads are memory copies)
        self.parallel_reads = parallel_reads
        pace = (
            pace or _no_pause
        )  # called between the load's steps (offgraph.server.models.pacing: a load yields to serving)
        mv = ModelVersion.open(self.version_dir, verify_dense=verify)
        self.manifest = m = mv.manifest
        pace()
        self.version = int(self.version_dir.name) if self.version_dir.name.isdigit() else 0
        self.spec = mv.spec
        self.dim = m.embedding_dim
        self.poolings = [f.pooling for f in self.spec.fields]
        self.half_lives = [f.half_life for f in self.spec.fields]
        if m.field_names() != self.spec.field_names:
            raise ModelDirError(f"{self.version_dir}: manifest field order differs from its spec")
        if max(f.rows for f in self.spec.fields) > ROW_LIMIT:
            raise ModelDirError(f"{self.version_dir}: tables of more than 2**{ROW_BITS} rows are not supported")
        if len(self.spec.fields) > BIAS_TABLE:  # table BIAS_TABLE is the bias row's
            raise ModelDirError(f"{self.version_dir}: {len(self.spec.fields)} fields; at most {BIAS_TABLE}")
        try:  # a tokenize field's terms depend on its segmenter (and a library's version): refuse another
            check_segmenters(self.spec, m.segmenters, str(self.version_dir))
        except ValueError as e:
            raise ModelDirError(str(e)) from None
        self.calibration = self.spec.model.calibration
        # the down-sampling correction is the one the run trained at (its spec, as exported), never another
        check_negative_rate(self.calibration.negative_rate, sampled_negative_rate(m.training), str(self.version_dir))
        # what a score is: "ctr", or "ranking" for a listwise model without a fitted calibration (a manifest from
        # before these were recorded: its training config's loss, else pointwise)
        self.training_loss = training_loss(m, source=str(mv.manifest_path))
        self.score_kind = score_kind(self.training_loss, self.calibration)
        self.num_dense = len(self.spec.numeric)
        # max_request_values bounds one score call's feature values (see offgraph.features.value_limits)
        self.fg = FeatureGenerator(self.spec, item_cache_size=item_cache_size, max_request_values=max_request_values)
        self._fg_lock = threading.Lock()
        try:
            self.store = mv.open_store(
                store_mode,
                block_cache_mb=block_cache_mb,
                statistics=store_statistics,
                direct_reads=direct_reads,
            )
        except ValueError as e:
            raise ModelDirError(f"{self.version_dir}: store does not open: {e}") from None
        pace()
        self.row_cache = RowCache(row_cache_mb, self.store.codec) if row_cache_mb > 0 else None
        self._counts = {
            "store_rows_read": 0,
            "cache_hits": 0,
            "cache_misses": 0,
            "ignored_keys": 0,
            "unknown_candidates": 0,
            "unusable_feature_rows": 0,
        }
        self._counts_lock = threading.Lock()
        self._follower: Follower | None = None
        self.join: FeatureJoin | None = None  # the spec's feature tables (offgraph/feature_tables/join.py)
        self._ids_only_checks = ids_only_checks(self.spec)
        # the item-scope check of a scope no table fills: (item key, its other inputs), or None
        self._item_key_only = next(((k, o) for sc, k, o in self._ids_only_checks if sc == "item"), None)
        self._item_numeric = sum(1 for f in self.spec.numeric if f.scope != "request")
        self.activity = Activity()
        self._appended_gen = 0  # moves when keys are appended to a vocabulary: held candidates' ids may be older
        try:
            self._read_appended()
            if self.spec.tables:
                self.join = FeatureJoin(
                    self.version_dir, self.spec, store_mode, record_cache_bytes=item_cache_size * JOIN_RECORD_BYTES
                )
            join = self.join
            # what each candidate sent as bytes makes (offgraph/scoring/candidate_cache.py), one entry per item
            self.candidates = CandidateCache(
                item_cache_size * CANDIDATE_BYTES,
                # both counters only grow: their sum moves when either does
                (lambda: join.generation + self._appended_gen) if join is not None else (lambda: self._appended_gen),
                self.fg.crossed_item_fields,
            )
            self._loaded, serve = mv.dense
            self._serve = SignatureCall(serve)
            self._split = self._split_signature()
            # the dense head's forward in NumPy (offgraph/scoring/numpy_head.py) for requests of at most this many
            # candidates (None: as measured for the BLAS threads, default_max_rows; 0: never), where it matched the
            # SavedModel at load; else (and above it) the SavedModel's signature
            rows = default_max_rows() if numpy_head_max_rows is None else numpy_head_max_rows
            self._numpy_rows = int(rows)
            self._numpy_dense = self._numpy_head() if self._numpy_rows > 0 else None
            pace()
            if store_mode == "follow":
                self._follower = Follower(
                    self.store,
                    self.row_cache,
                    float(follow_interval_s),
                    catch_up_s=catch_up_s,
                    idle=self.activity,
                    on_catch_up=self._read_appended if self.fg.appended else None,
                )
        except BaseException:
            if self.join is not None:
                self.join.close()
            self.store.close()
            raise

    def _read_appended(self) -> None:
        """The keys appended to the vocabularies since the last read (``offgraph.store.vocabulary_appends``; the
        updater writes them with the rows of the stream trainer's new ids): FG maps them to their rows from now on,
        and the candidates held with older ids go."""
        for t, f in enumerate(self.spec.fields):
            if f.capacity:
                keys = read_appended(self.store, t, len(self.fg.appended[f.name].keys))
                if keys:
                    with self._fg_lock:
                        self.fg.append_keys(f.name, keys)
                    self._appended_gen += 1

    # -- the request path -------------------------------------------------------------------
    def features(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]], grouped: bool = False):
        """The FG batch of one request (``FeatureGenerator.transform``; ``grouped``: its distinct value lists)."""
        with self._fg_lock:  # the item cache is shared state
            return self.fg.transform(request, candidates, grouped=grouped)

    def _segments(self, request, candidates) -> tuple[Segments, dict]:
        """The pooled segments of one request's candidates, and ``stats``: FG, unique keys, row cache, store
        reads of the cache misses only, pooling. The lookups and pooling run once per distinct value list of a
        field (a request field's one, a cross's groups). ``stats``: lookups, unique_rows, cache_hits,
        store_rows_read and found_rows (of the rows read from the store), store_read_seconds (its wall time,
        also observed as ``offgraph_store_read_seconds``), ``dense`` (the numeric fields' [N, k] values) and
        ``ignored_keys`` (raw keys the model does not read), ``bias_offset`` (the store's bias row, read with the
        rows: offgraph.store.keys.BIAS_TABLE)."""
        return self._segments_of(self.features(request, candidates, grouped=True))

    def _segments_of(self, batch) -> tuple[Segments, dict]:
        """:meth:`_segments` of a request's FG batch (grouped)."""
        keys = batch_keys(batch)
        feed = self._follower  # fresh rows from the writer's feed, looked up first
        timing: dict = {}
        # the bias row goes last: its key is above every field's, so the keys stay ascending, and no lookup reads it
        rows, hits, read, found = read_through_cache(
            self.row_cache,
            self.store,
            np.append(keys.unique_tables, np.uint32(BIAS_TABLE)),
            np.append(keys.unique_rows, BIAS_ROW),
            feed,
            np.append(keys.unique_keys, BIAS_KEY),
            parallel=self.parallel_reads,
            timing=timing,
        )
        read_s = timing.get("store_read_seconds")
        if read_s is not None:
            STORE_READ_SECONDS.labels(self.version_dir.parent.name).observe(read_s)
        with self._counts_lock:
            c = self._counts
            c["store_rows_read"] += read
            c["ignored_keys"] += batch.ignored_keys
            if self.row_cache is not None:
                c["cache_hits"] += hits
                c["cache_misses"] += read
        segments = pool_rows(batch, keys, rows, self.poolings, self.half_lives)
        stats = {
            "lookups": int(len(keys.inverse)),
            "unique_rows": int(len(keys.unique_rows)),
            "cache_hits": hits,
            "store_rows_read": read,
            "found_rows": found,
            "dense": batch.dense,
            "ignored_keys": batch.ignored_keys,
            "store_read_seconds": read_s or 0.0,
            "bias_offset": float(rows[-1, -1]),
        }
        return segments, stats

    def _split_signature(self):
        """(signature, request field indices, candidate field indices) of the dense head's split
        signature when the manifest records one (a version exported before it: None)."""
        split = self.manifest.dense.split if self.manifest.dense is not None else None
        if split is None:
            return None
        if sorted(split.request_fields + split.candidate_fields) != list(range(len(self.spec.fields))):
            raise ModelDirError(f"{self.version_dir}: dense.split does not divide the {len(self.spec.fields)} fields")
        try:
            serve = self._loaded.signatures[split.name]
        except KeyError:
            raise ModelDirError(f"{self.version_dir}: the dense head has no signature {split.name!r}") from None
        return (
            SignatureCall(serve),
            np.asarray(split.request_fields, np.int64),
            np.asarray(split.candidate_fields, np.int64),
        )

    def _numpy_head(self) -> Callable[[Mapping[str, Any]], np.ndarray] | None:
        """The NumPy forward of the signature this version scores with (the split one when it has it), if it
        gives the SavedModel's CTRs on a probe batch (``checked_head``); else None (logged)."""
        w = read_weights(self._loaded, len(self.spec.fields), self.dim, self.num_dense)
        if self._split is not None:
            call, req, cand = self._split
            head = NumpyHead(w, req, cand) if w is not None else None
            return checked_head(head, call, call.shapes, split=True, source=str(self.version_dir))
        head = NumpyHead(w) if w is not None else None
        return checked_head(head, self._serve, self._serve.shapes, split=False, source=str(self.version_dir))

    def _dense_segments(self, segments: Segments, dense: np.ndarray | None) -> np.ndarray:
        """CTRs [N] of the pooled segments: through the split signature when the version has one (the
        request fields' part of the head once, from their one pooled row), else ``serving_default``."""
        if self._split is not None:
            _, req, cand = self._split
            return self._call_split(segments.split(req, cand), dense)
        return self._call_whole(*segments.whole(), dense)

    def _call_split(self, parts: dict[str, np.ndarray], dense: np.ndarray | None) -> np.ndarray:
        inputs: dict[str, Any] = {**parts, "dense": dense} if self.num_dense else parts
        if self._numpy_dense is not None and len(parts["cand_emb"]) <= self._numpy_rows:
            return self._numpy_dense(inputs)
        return self._split[0](inputs)["ctr"].numpy()

    def _call_whole(self, emb: np.ndarray, first_order: np.ndarray, dense: np.ndarray | None) -> np.ndarray:
        inputs: dict[str, Any] = {"emb": emb, "first_order": first_order}
        if self.num_dense:
            inputs["dense"] = dense
        if self._numpy_dense is not None and len(emb) <= self._numpy_rows:
            return self._numpy_dense(inputs)
        return self._serve(inputs)["ctr"].numpy()

    def score(self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return self.score_joined(request, candidates)[0]

    def score_joined(
        self, request: Mapping[str, Any], candidates: Sequence[Mapping[str, Any]]
    ) -> tuple[np.ndarray, Joined]:
        """Scores, and the join's result (the filled request, the candidates, unknown counts): the feature tables
        fill what the body did not send (offgraph/feature_tables/join.py). ``candidates``: ``RawCandidates`` (the
        server's score route: each candidate's JSON bytes as sent) or decoded ones (the library's dicts, taken as
        ``RawCandidates.decoded``); one path for both.

        The candidates the candidate cache holds (by their bytes) are neither decoded nor joined nor keyed; the
        others are decoded in one call, joined, generated (``FeatureGenerator.candidate_entries``) and held,
        unless the request found something unusual: a candidate the decoder refuses (the whole body validated:
        its 422, or the schema's values, not held), a stored row FG refuses (screened: left out, as unknown, and
        nothing of the request held). The request's own values are refused by FG as in any request; a body sent
        ids-only in a scope no table fills is refused (``IdsOnlyError``) before any FG."""
        cands = candidates if isinstance(candidates, RawCandidates) else RawCandidates.decoded(candidates)
        n = len(cands)
        cache = self.candidates
        raws = cands.raws
        looked = raws is not None and n > 0 and cache.worth_it()
        gen, got = cache.lookup(raws) if looked and raws is not None else (0, [None] * n)
        miss: dict[Any, int] = {}  # the candidates to make, by their bytes (one sent twice is made once) or place
        if None in got:
            for i, e in enumerate(got):
                if e is None:
                    miss.setdefault(raws[i] if raws is not None else i, i)
        dicts = cands.decode(list(miss.values())) if miss else []
        only = self._item_key_only
        only_key = [only is not None and only[0] in c and not any(x in c for x in only[1]) for c in dicts]
        # a scope no table fills must not be sent ids-only (a model may have an item table and no user table): the
        # item scope is judged from the flags (the held candidates' and the others'), by a stand-in candidate
        key_only = only is not None and n and all(only_key) and all(e[ONLY_KEY] for e in got if e is not None)
        stand_in = ({only[0]: None},) if key_only and only is not None else ()
        check_not_ids_only(self._ids_only_checks, self.version_dir.parent.name, request, stand_in)
        joined = self.join.fill(request, dicts) if self.join is not None else Joined(request, dicts)
        if n == 0:
            self._count_join(joined)
            return np.zeros(0, np.float32), joined
        try:
            try:
                entries, batch = self._batch(joined, got, miss, only_key, raws)
            except FeatureValueError:
                # a stored row FG refuses is scored as unknown, never the caller's 422 (offgraph/feature_tables/join.py)
                screened = self.join.screen(request, dicts, joined) if self.join is not None else None
                if screened is None:
                    self._refuse(request, cands)
                    raise
                joined = screened
                entries, batch = self._batch(joined, got, miss, only_key, raws)
        except BaseException:
            self._count_join(joined)  # rows left out are counted, the request refused or not
            raise
        if looked and cands.keyable and not joined.unusable and miss:
            cache.put(gen, list(miss), [entries[i] for i in miss.values()])
        # the candidates as FG saw them, for the served log: references to the entries' records, merged only if asked
        seen = (
            JoinedCandidates(cands, lambda i: entries[i][RECORDS:], self.join)
            if self.join is not None and self.join.item_tables
            else None
        )
        done = Joined(
            joined.request,
            cands,
            sum(map(itemgetter(LACKING), entries)),
            joined.unknown_request,
            joined.unusable,
            seen=seen,
        )
        with self.activity:  # the follower defers its work while a score runs
            try:
                segments, st = self._segments_of(batch)
            finally:
                self._count_join(done)
            return calibrate(self._dense_segments(segments, st["dense"]), self.calibration, st["bias_offset"]), done

    def _refuse(self, request: Mapping[str, Any], cands: RawCandidates) -> None:
        """Raise FG's refusal of the whole body (``FeatureGenerator.transform``: the request's scopes and values
        first, a candidate named by its place in the body, not among the candidates the cache lacked)."""
        every = cands.dicts()
        joined = self.join.fill(request, every) if self.join is not None else Joined(request, every)
        self.features(joined.request, joined.candidates)

    def _batch(
        self, joined: Joined, got: list, miss: dict[Any, int], only_key: list[bool], raws: list[bytes] | None
    ) -> tuple[list, Any]:
        """(every candidate's entry, the request's FG batch): the entries of the candidates ``got`` lacks (made
        from ``joined``'s candidates, in ``miss``' order) beside the held ones, then the request's FG."""
        entries = list(got)
        if miss:
            lacking = joined.lacking or (False,) * len(miss)
            # the records the join merged into each (RECORDS on): what the served log writes of a held candidate
            records = zip(*joined.records) if joined.records else repeat(())
            with self._fg_lock:
                made = self.fg.candidate_entries(joined.candidates)
            for i, e, lack, ok, rec in zip(miss.values(), made, lacking, only_key, records):
                entries[i] = (*e, lack, ok, *rec)
            if raws is not None and len(miss) < got.count(None):  # a candidate sent twice: its first one's entry
                entries = [e if e is not None else entries[miss[r]] for e, r in zip(entries, raws)]
        n = len(entries)
        numeric = None
        if self._item_numeric:
            numeric = np.frombuffer(b"".join(map(itemgetter(4), entries)), np.float32).reshape(n, -1)
        with self._fg_lock:
            batch = self.fg.transform_entries(
                joined.request, entries, numeric, sum(map(itemgetter(3), entries)), grouped=True
            )
        return entries, batch

    def _count_join(self, joined: Joined) -> None:
        if joined.unknown_candidates or joined.unusable:
            with self._counts_lock:
                self._counts["unknown_candidates"] += joined.unknown_candidates
                self._counts["unusable_feature_rows"] += joined.unusable

    def hot_rows(self, limit: int) -> dict[str, Any] | None:
        """What the next version warms up with (:meth:`warm_rows`, :meth:`warm_features`): the
        ``limit`` hottest field rows of the row cache (``RowCache.hot_keys``; not the bias row) with the tables they belong to
        (``"tables"``, ``"rows"``, ``"fields"``: {table id: (name, rows)}; none without a row cache)
        and a copy of the FG item cache (``"fg"``, its ``limit`` most recent items at most)."""
        if limit <= 0:
            return None
        with self._fg_lock:
            out: dict[str, Any] = {"fg": self.fg.item_cache_state(limit)}
        if self.row_cache is not None:
            t, r = self.row_cache.hot_keys(limit + 1)
            field = t != BIAS_TABLE  # the bias row is this version's own: no other version's row means the same
            t, r = t[field][:limit], r[field][:limit]
            out.update(
                tables=t,
                rows=r,
                fields=self.table_fields(),
            )
        return out

    def table_fields(self) -> dict[int, tuple[str, int]]:
        """{table id: (field name, rows)}: what a row id means here (:meth:`hot_rows`' ``fields``)."""
        return {f.table_id: (f.name, f.rows) for f in self.manifest.fields}

    def warm_features(self, hot: dict[str, Any] | None, pace: Callable[[], None] | None = None) -> int:
        """Adopt another version's FG item cache (:meth:`hot_rows`) if it ran the same spec; returns
        the items adopted. Its first requests then run no item FG for recently served items."""
        if not hot or "fg" not in hot:
            return 0
        with self._fg_lock:  # nothing serves on this version yet: the lock is not contended
            return self.fg.adopt_item_cache(hot["fg"], pace)

    def warm_rows(
        self,
        hot: dict[str, Any] | None,
        batch: int = 256,
        pace: Callable[[], None] | None = None,
        until: float | None = None,
        parallel: bool = False,
    ) -> int:
        """Read the rows of another version's :meth:`hot_rows` that mean the same here (same table
        id, field name and table size: the same raw value hashes to the same row) through the write
        feed, row cache and store, as requests do: they fill this version's row cache and its block
        cache (data and index blocks) before it serves. ``pace`` is called after each batch (the
        loader's ``offgraph.server.models.pacing.Pacer``: the serving version keeps most of the time). The shards are
        read one after another on this thread, not by the read pool, so that warming takes one CPU
        at most while the serving version's requests need the others; ``parallel``: by the read pool
        (nothing serves yet). ``until``: a ``time.perf_counter()`` time after which no batch starts.
        At most the row cache's capacity is read (the first rows: ``hot`` is hottest first). Returns
        the rows read."""
        if not hot or len(hot.get("rows", ())) == 0 or self.row_cache is None:
            return 0
        pace = pace or _no_pause
        mine = self.table_fields()
        same = np.array(sorted(t for t, nr in hot["fields"].items() if mine.get(t) == nr), dtype=np.uint32)
        keep = np.isin(hot["tables"], same)
        room = int(self.row_cache.capacity_rows)
        tables, rows = hot["tables"][keep][:room], hot["rows"][keep][:room]
        done = 0
        for s in range(0, len(rows), batch):
            if until is not None and time.perf_counter() >= until:
                break
            read_through_cache(
                self.row_cache,
                self.store,
                tables[s : s + batch],
                rows[s : s + batch],
                self._follower,
                parallel=parallel,
            )
            done += len(rows[s : s + batch])
            pace()  # small batches: the serving version's requests wait milliseconds at most for the GIL
        return done

    def stats(self) -> dict[str, Any]:
        """Cumulative counters (ints) and freshness of this scorer: ``store_rows_read``,
        ``cache_hits``, ``cache_misses``, ``cache_entries``, ``candidate_cache_hits`` / ``candidate_cache_misses``
        (candidates looked up in the candidate cache: ``offgraph.scoring.candidate_cache``), ``vocabulary_unknown``
        (values of vocabulary fields scored on their unknown row; ``vocabulary_unknown:FIELD`` per field), ``block_cache_hits`` / ``block_cache_misses``
        (RocksDB's block cache, with ``store_statistics``; else 0); when following:
        ``last_feed_poll_unix`` (when the follower last read the write feed: rows the writer
        fed before it are served; 0.0 before its first step), ``last_catch_up_unix`` (when
        the last catch-up of the RocksDB secondary began: rows written before it are in the
        store view; 0.0 before the first), ``catch_ups`` and ``last_catch_up_seconds``, ``epochs`` (feed epochs mapped now),
        ``epochs_mapped`` / ``epochs_released``, ``feed_rows`` (rows in them),
        ``feed_hits`` (rows served from them), ``changes_applied`` (keys invalidated
        in the row cache when an epoch was released), ``rows_written_through`` (of those, put back into the
        row cache at their newest value), ``cache_clears`` (whole-cache
        drops: feed epochs went missing), ``follow_errors``, ``follow_cpu_seconds``."""
        with self._counts_lock:
            out: dict[str, Any] = dict(self._counts)
        cs = self.row_cache.stats() if self.row_cache is not None else None
        out["candidate_cache_hits"], out["candidate_cache_misses"] = self.candidates.hits, self.candidates.misses
        out["vocabulary_unknown"] = sum(self.fg.vocabulary_unknown.values())
        out.update({VOCABULARY_UNKNOWN + k: v for k, v in self.fg.vocabulary_unknown.items()})
        out["cache_entries"] = cs["entries"] if cs else 0
        out["cache_capacity_rows"] = cs["capacity_rows"] if cs else 0
        out["cache_bytes"] = cs["bytes"] if cs else 0
        bc = self.store.block_cache_stats()  # None unless store_statistics
        out["block_cache_hits"] = bc["hits"] if bc else 0
        out["block_cache_misses"] = bc["misses"] if bc else 0
        if self._follower is not None:
            out.update(self._follower.stats())
        else:
            out.update(NOT_FOLLOWING)
        return out

    def resize_memory(self, row_cache_mb: float, block_cache_mb: int, item_cache_items: int) -> None:
        """Bound the version's caches anew (its share of the memory budget changed: a second version
        of its model started or stopped serving beside it). The row cache keeps its most used rows
        (``RowCache.resize``); the block cache and the FG item cache evict down as they are used."""
        if self.row_cache is not None and row_cache_mb > 0:
            self.row_cache.resize(row_cache_mb)
        self.store.set_cache_mb(max(1, int(block_cache_mb)))
        if item_cache_items > 0:
            self.fg.resize_item_cache(int(item_cache_items))
            self.candidates.resize(int(item_cache_items) * CANDIDATE_BYTES)
            if self.join is not None:
                self.join.resize_cache(int(item_cache_items) * JOIN_RECORD_BYTES)

    def memory_in_use(self) -> dict[str, int]:
        """Bytes each part of the memory budget holds now (``offgraph.scoring.memory_budget``): ``row_cache`` (its
        arena), ``block_cache`` (RocksDB's usage), ``item_cache`` (FG items held, at ``FG_ITEM_BYTES`` each: an
        estimate; and the bytes the feature join's record cache counts) and ``feed`` (the write feed's epochs
        mapped)."""
        feed = self._follower.feed.epochs if self._follower is not None else []
        return {
            "row_cache": int(self.row_cache.stats()["bytes"]) if self.row_cache is not None else 0,
            "block_cache": int(self.store.cache_usage()),
            "item_cache": len(self.fg._cache) * FG_ITEM_BYTES  # noqa: SLF001 - the FG's own bounded cache
            + (self.join.cache_bytes if self.join is not None else 0)
            + self.candidates.nbytes,
            "feed": sum(feed_file_bytes(ep.slots, ep.rb) for ep in feed),
        }

    def close(self) -> None:
        if self._follower is not None:
            self._follower.stop()
        if self.join is not None:
            self.join.close()
        self.store.close()

    def release(self, pace: Callable[[], None] | None = None) -> None:
        """Free a closed version's memory one part at a time, ``pace()`` after each: the FG caches (in
        chunks: ``FeatureGenerator.release``), the follower with its feed mapping, the row cache, the
        dense model, the feature tables' handles. Dropping the last reference to a version that served
        would free all of it in one deallocation, holding the GIL while the next version serves.
        The scorer cannot score afterwards."""
        pace = pace or _no_pause
        self.fg.release(pace)
        self.candidates.release(pace)
        pace()
        for attr in ("_follower", "row_cache", "_serve", "_split", "_numpy_dense", "_loaded", "join"):
            setattr(self, attr, None)
            pace()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _no_pause() -> None:
    return None


def resolve_version(path: str | Path) -> Path:
    """A version directory itself, or a model directory's newest complete version."""
    path = Path(path)
    if (path / "manifest.json").exists() or path.name.isdigit():
        return path
    versions = complete_versions(path)
    if not versions:
        raise ModelDirError(f"{path}: no complete version (a version is complete once its manifest.json exists)")
    return path / str(versions[-1])


def load(model_dir: str | Path, **kwargs) -> Scorer:
    return Scorer(resolve_version(model_dir), **kwargs)
