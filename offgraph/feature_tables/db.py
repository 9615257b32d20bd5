"""One entity feature table (``offgraph.features.table_spec``) in its own small RocksDB (rocksdict, raw mode).

Layout: ``MODELS/NAME/features/TABLE/`` holds ``table.json`` (format, the key, scope and
columns, the encodings) and ``db/`` (the RocksDB). The tables are SHARED by the model's
versions (docs/DESIGN.md "Feature tables" says why: they hold facts about users and items, not
model state, so a rollback or a swap must not bring back old facts, and a row streamed while
version 3 served is still there when version 4 comes in).

Records::

    b"k" + utf8(canonical(key))  ->  msgpack [seq, {column: raw value}]
    b"m" + position key          ->  position (the updater's, written in the row's batch)

The key is the canonical string of ``offgraph.features.hashing`` (so 242, 242.0 and "242" are
one movie, as they are one embedding row). ``seq`` is the last-write-wins number of streamed
rows; bulk-loaded rows carry -1 (any streamed row replaces them). A column absent from a row
is no value. A small separate DB (not the embedding store) because followers catch it up
every 0.2 s (``offgraph/feature_tables/join.py``): a catch-up of a DB this size is cheap enough for
that (measured: ``bench/results/update-freshness/README.md``), where the embedding store's shards
are caught up every 30 s.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from rocksdict import AccessType, IngestExternalFileOptions, Options, Rdict, SstFileWriter, WriteBatch, WriteOptions

from offgraph.features.hashing import canonical
from offgraph.features.table_spec import TableSpec

FORMAT = "offgraph-feature-table"
FORMAT_VERSION = 1
KEY_ENCODING = "b'k' + utf8(canonical string of the key)"
VALUE_ENCODING = "msgpack [seq int, {column: value}]"
ROW_PREFIX = b"k"
META_PREFIX = b"m"
LOADED_SEQ = -1
"""The seq of a bulk-loaded row: any streamed row (seq >= 0) replaces it."""
FEATURES_DIR = "features"
TABLE_FILE = "table.json"

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(tuple[int, dict[str, Any]]).decode


class FeatureTableError(ValueError):
    """A feature table that cannot be used, or a row it cannot take; the message names it."""


def table_dir(model_dir: str | Path, name: str) -> Path:
    return Path(model_dir) / FEATURES_DIR / name


def row_key(value: Any) -> bytes | None:
    """The record key of one key value; None for no value (null, NaN, "") or a list."""
    if isinstance(value, (list, tuple, dict)):
        return None
    c = canonical(value)
    return None if c is None else ROW_PREFIX + c.encode("utf-8")


def row_keys(values: Iterable[Any]) -> list[bytes | None]:
    """:func:`row_key` of each value, in one pass: a plain ``int`` or non-empty ``str`` (the usual keys) is
    encoded straight away, as ``canonical`` writes it; any other value (bool, float, numpy, bytes, a
    subclass, no value) takes :func:`row_key`."""
    return [
        ROW_PREFIX + str(v).encode()
        if (t := type(v)) is int
        else ROW_PREFIX + v.encode("utf-8")
        if t is str and v
        else row_key(v)
        for v in values
    ]


def encode_row(seq: int, row: Mapping[str, Any]) -> bytes:
    return _encode((seq, row))


def table_record(table: TableSpec) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **table.to_dict(),
        "key_encoding": KEY_ENCODING,
        "value_encoding": VALUE_ENCODING,
    }


def _options() -> Options:
    o = Options(raw_mode=True)
    o.create_if_missing(True)
    return o


class FeatureDB:
    """``mode``: "w" (the one writer: ``offgraph features load`` or the updater), "r" (read-only,
    a snapshot as of the open), "follow" (a RocksDB secondary: :meth:`catch_up` sees new writes)."""

    def __init__(self, path: str | Path, mode: str = "r"):
        if mode not in ("r", "w", "follow"):
            raise ValueError(f"mode must be 'r', 'w' or 'follow', got {mode!r}")
        self.path, self.mode = Path(path), mode
        try:
            self.info = json.loads((self.path / TABLE_FILE).read_text())
        except (OSError, ValueError) as e:
            raise FeatureTableError(
                f"feature table {self.path}: no readable {TABLE_FILE} ({e}); create it with "
                "`offgraph features load` or `offgraph export`"
            ) from None
        if self.info.get("format") != FORMAT or self.info.get("format_version") != FORMAT_VERSION:
            raise FeatureTableError(
                f"feature table {self.path}: format {self.info.get('format')!r} v"
                f"{self.info.get('format_version')!r}, expected {FORMAT!r} v{FORMAT_VERSION}"
            )
        self._secondary: str | None = None
        self._caught_up: tuple | None = None  # follow: the files' mark at the last catch-up (_files_mark)
        self._opts = _options()
        db = str(self.path / "db")
        try:
            if mode == "w":
                access = AccessType.read_write()
            elif mode == "r":
                access = AccessType.read_only(False)
            else:
                self._secondary = tempfile.mkdtemp(prefix="offgraph-features-follow-")
                access = AccessType.secondary(self._secondary)
            self._db = Rdict(db, self._opts, access_type=access)
        except Exception as e:  # noqa: BLE001 - rocksdict raises plain Exception
            self._cleanup()
            held = "lock" in str(e).lower()
            raise FeatureTableError(
                f"feature table {self.path}: cannot open with mode={mode!r}: {e}"
                + (" (another writer, e.g. `offgraph update` or a load, holds it: stop it first)" if held else "")
            ) from None

    @classmethod
    def create(cls, path: str | Path, table: TableSpec) -> FeatureDB:
        """Open the table at ``path`` for writing, creating it if needed (:func:`ensure_table`)."""
        ensure_table(path, table)
        return cls(path, "w")

    # ------------------------------------------------------------------ reads
    def get(self, keys: Sequence[bytes | None]) -> list[dict[str, Any] | None]:
        """The rows of record keys (``row_key``; None reads as no row), in ONE multi_get."""
        return list(map(decode_row, self.get_raw(keys)))

    def get_raw(self, keys: Sequence[bytes | None]) -> list[bytes | None]:
        """The stored records of record keys (None: no row), undecoded (:func:`decode_row`), in ONE multi_get."""
        want = [k for k in keys if k is not None]
        got = self._db.get(want) if want else []
        it = iter(got)
        return [None if k is None else next(it) for k in keys]

    def seqs(self, keys: Sequence[bytes]) -> list[int | None]:
        """The stored seq of each record key (None: no row), in one multi_get."""
        return [None if v is None else _decode(v)[0] for v in (self._db.get(list(keys)) if keys else [])]

    def get_meta(self, key: bytes) -> bytes | None:
        return self._db.get(META_PREFIX + key)

    def rows(self) -> Iterable[tuple[bytes, tuple[int, dict]]]:
        """Every (record key, (seq, row)), in key order (tests, dumps)."""
        for k, v in self._db.items(from_key=ROW_PREFIX):
            if not k.startswith(ROW_PREFIX):
                break
            yield k, _decode(v)

    # ------------------------------------------------------------------ writes
    def write(
        self,
        keys: Sequence[bytes],
        rows: Sequence[Mapping[str, Any]],
        seqs: Sequence[int],
        *,
        meta: Mapping[bytes, bytes] | None = None,
        sync: bool = False,
    ) -> tuple[int, int]:
        """Last write wins by seq: a row whose stored seq is >= its new seq is skipped (of
        duplicates in one call the highest seq wins). The rows and ``meta`` (positions) go in ONE
        atomic WriteBatch (logged: a follower catches up from the WAL). Returns (applied, stale)."""
        best: dict[bytes, int] = {}
        for i, (k, s) in enumerate(zip(keys, seqs)):
            j = best.get(k)
            if j is None or s > seqs[j]:
                best[k] = i
        uk = list(best)
        stored = self._db.get(uk) if uk else []
        wk, wv = [], []
        for k, old in zip(uk, stored):
            i = best[k]
            if old is not None and _decode(old)[0] >= seqs[i]:
                continue
            wk.append(k)
            wv.append(encode_row(int(seqs[i]), rows[i]))
        for mk, mv in (meta or {}).items():
            wk.append(META_PREFIX + mk)
            wv.append(mv)
        if wk:
            wb = WriteBatch(raw_mode=True)
            deque(map(wb.put, wk, wv), maxlen=0)
            wo = WriteOptions()
            wo.sync = sync
            self._db.write(wb, wo)
        applied = len(wk) - len(meta or {})
        return applied, len(keys) - applied

    def ingest_sorted(self, items: Iterable[tuple[bytes, bytes]], tmp_dir: str | Path) -> int:
        """Bulk load: ``(record key, value)`` in strictly ascending key order into one external SST
        file, ingested (no memtable, no WAL; the exporter's bulk load does the same per shard).
        Ingested rows replace stored ones. Returns the rows written."""
        tmp = Path(tempfile.mkdtemp(prefix="load-", dir=tmp_dir))
        try:
            sst = str(tmp / "rows.sst")
            w = SstFileWriter(self._opts)
            w.open(sst)
            n = 0
            for k, v in items:
                w[k] = v
                n += 1
            if n == 0:
                return 0
            w.finish()
            opts = IngestExternalFileOptions()
            opts.set_move_files(True)
            self._db.ingest_external_file([sst], opts)
            return n
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def flush(self) -> None:
        self._db.flush()

    # ------------------------------------------------------------------ following
    def catch_up(self) -> bool:
        """Catch the secondary up with the writer; False, doing nothing, when none of the files a write or an
        ingested file changes (the WALs, the MANIFESTs, CURRENT) moved since the last catch-up began.
        ``try_catch_up_with_primary`` holds the GIL while it reads them, a millisecond even when nothing
        changed, and every worker follows each table several times a second."""
        if self.mode != "follow":
            raise ValueError(f"catch_up needs mode='follow', not {self.mode!r}")
        mark = self._files_mark()  # before: a write racing the catch-up moves it again, and the next one runs
        if mark == self._caught_up:
            return False
        self._db.try_catch_up_with_primary()
        self._caught_up = mark
        return True

    def _files_mark(self) -> tuple[tuple[str, int, int], ...]:
        """(name, size, mtime) of the writer's WALs, MANIFESTs and CURRENT: what every write, flush, compaction
        and ingestion appends to or replaces."""
        out = []
        with os.scandir(self.path / "db") as entries:
            for e in entries:
                if e.name.endswith(".log") or e.name.startswith("MANIFEST-") or e.name == "CURRENT":
                    try:
                        st = e.stat()
                    except FileNotFoundError:  # removed by the writer meanwhile: its removal moved the mark
                        continue
                    out.append((e.name, st.st_size, st.st_mtime_ns))
        return tuple(sorted(out))

    def change_mark(self) -> tuple[int, int]:
        """What moves whenever what the table holds may have changed: RocksDB's latest sequence number (a
        write) and its super-version number (a flush, a compaction, and an ingested file, which takes no
        sequence number when its keys are new)."""
        return self._db.latest_sequence_number(), self._db.property_int_value("rocksdb.current-super-version-number")

    def close(self) -> None:
        db = getattr(self, "_db", None)
        if db is not None:
            db.close()
            self._db = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._secondary:
            shutil.rmtree(self._secondary, ignore_errors=True)
            self._secondary = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def ensure_table(path: str | Path, table: TableSpec) -> None:
    """Make ``path`` a table for ``table`` without opening an existing DB (its writer, the updater,
    may hold it): write ``table.json``, or check an existing one (same key and scope) and grow its
    columns to include ``table``'s (rows written before lack the new ones: no value); create the
    empty DB only when there is none."""
    path = Path(path)
    f = path / TABLE_FILE
    if f.exists():
        info = json.loads(f.read_text())
        if (info.get("key"), info.get("scope")) != (table.key, table.scope):
            raise FeatureTableError(
                f"feature table {path}: keyed by {info.get('key')!r} ({info.get('scope')}) on disk, but the "
                f"spec keys '{table.name}' by {table.key!r} ({table.scope}): a table's key cannot change; "
                "declare a new table name"
            )
        cols = list(info["columns"]) + [c for c in table.columns if c not in info["columns"]]
        if cols != info["columns"]:
            _write_json(f, {**info, "columns": cols})
    else:
        path.mkdir(parents=True, exist_ok=True)
        _write_json(f, table_record(table))
    if not (path / "db" / "CURRENT").exists():
        Rdict(str(path / "db"), _options()).close()


def decode_row(v: bytes | None) -> dict[str, Any] | None:
    """The ``{column: value}`` of a stored record (None for none)."""
    return None if v is None else _decode(v)[1]


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)
