"""The updater's view of the keys appended to the live version's vocabularies: what a delta file's appends
(``DeltaBatch.appends``) must fit, and the meta records that apply them (``offgraph.store.vocabulary_appends``).

Appends are dense: the i-th key appended to a field is its row V + 1 + i. A file's appends must continue the
stored ones (the next free row) or repeat them exactly (a file re-applied after a crash, or to the shards that
lacked it); anything else is refused by name, since a key on two rows or a row holding two keys would score ids
on rows trained for others. A row of the reserved range that no key holds yet is written like any row: no id maps
there until its key's append (over Kafka the append rides partition 0, and a newer value of the row may arrive on
its own partition first: per-row seqs keep the newest).
"""

from __future__ import annotations

import numpy as np

from offgraph.features.spec import FeatureSpec
from offgraph.features.vocabulary import UNKNOWN_ROW, AppendedKeys
from offgraph.store.base import EmbeddingStore
from offgraph.store.vocabulary_appends import appends_meta, read_appended
from offgraph.streaming.deltas import DeltaBatch


class VocabularyState:
    """Per vocabulary field with a capacity (by table id): the keys appended so far."""

    def __init__(self, spec: FeatureSpec, store: EmbeddingStore) -> None:
        self.spec = spec
        self.fields: dict[int, AppendedKeys] = {}
        for t, f in enumerate(spec.fields):
            if f.capacity:
                app = AppendedKeys(f.name, f.appendable.start, f.capacity)
                keys = read_appended(store, t)
                if keys:
                    app.extend(keys)
                self.fields[t] = app

    def refusal(self, b: DeltaBatch) -> str | None:
        """Why ``b``'s appends cannot be applied now (None: they can)."""
        for t, (first, keys) in sorted(b.appends.items()):
            why = self._append_refusal(t, first, keys)
            if why is not None:
                return why
        return None

    def _append_refusal(self, t: int, first: int, keys: tuple[str, ...]) -> str | None:
        if t >= len(self.spec.fields):
            return f"appends keys to table {t}, but the model has {len(self.spec.fields)} fields"
        app = self.fields.get(t)
        f = self.spec.fields[t]
        if app is None:
            return f"appends keys to field '{f.name}', which has no vocabulary capacity (capacity: K in the spec)"
        where = f"appending to field '{f.name}'"
        if len(set(keys)) < len(keys):
            dup = next(k for i, k in enumerate(keys) if k in keys[:i])
            return f"{where}: key {dup!r} is appended twice"
        idx = first - app.first
        if idx < 0 or idx > len(app.keys):
            return (
                f"{where}: the keys start at row {first}, but the next free row is {app.next_row} (rows "
                f"{app.first}..{app.first + app.capacity - 1} take appended keys in order): an append was lost "
                "or another producer appends to this field"
            )
        if idx + len(keys) > app.capacity:
            return (
                f"{where}: {len(keys)} keys from row {first} go past the field's {app.capacity} rows for appended "
                f"keys (the last is {app.first + app.capacity - 1})"
            )
        held = app.keys[idx : idx + len(keys)]
        for j, (k, h) in enumerate(zip(keys, held)):
            if k != h:
                return f"{where}: row {first + j} already holds key {h!r}, not {k!r}"
        new = list(keys[len(held) :])
        if new and f.vocabulary is not None:
            in_file = f.vocabulary.rows_of(new)
            if (in_file != UNKNOWN_ROW).any():
                j = int(np.argmax(in_file != UNKNOWN_ROW))
                return f"{where}: key {new[j]!r} is in the vocabulary file already (row {int(in_file[j])})"
            held_rows = app.rows_of(new)  # the appended keys' index: no pass over every key held
            if (held_rows != UNKNOWN_ROW).any():
                j = int(np.argmax(held_rows != UNKNOWN_ROW))
                return f"{where}: key {new[j]!r} already has row {int(held_rows[j])}"
        return None

    def _new(self, t: int, b: DeltaBatch) -> tuple[str, ...]:
        first, keys = b.appends[t]
        app = self.fields[t]
        return keys[len(app.keys) - (first - app.first) :]

    def meta(self, b: DeltaBatch, whole: bool = False) -> dict[bytes, bytes]:
        """The meta records of ``b``'s (checked) appends: its new keys and counts; ``whole``: all of its keys
        (re-applied to shards that lack the file)."""
        out: dict[bytes, bytes] = {}
        for t, (first, keys) in b.appends.items():
            app = self.fields[t]
            if whole:
                out.update(appends_meta(t, first - app.first, list(keys)))
            elif new := self._new(t, b):
                out.update(appends_meta(t, len(app.keys), list(new)))
        return out

    def commit(self, b: DeltaBatch) -> None:
        """``b``'s appends are in the store."""
        for t in b.appends:
            if new := self._new(t, b):
                self.fields[t].extend(list(new))
