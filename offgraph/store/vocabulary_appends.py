"""Keys appended to a served vocabulary, as meta records of the version's store.

A vocabulary field with ``capacity: K`` (``offgraph.features.spec``) has rows V+1..V+K for ids first seen
after its vocabulary file was written. The stream trainer gives such an id the next free row and sends the
append with the rows it trained (``offgraph.streaming.deltas``: a delta file's ``vocabulary_appends``);
``offgraph update`` writes the appends in the SAME atomic batch as the file's rows and position, in every
shard, so they are applied exactly once with them. Per field (table id t), in every shard::

    vocabulary/t/n      the number of keys appended (decimal)
    vocabulary/t/i      the i-th appended key (UTF-8), row V + 1 + i

Appends are dense and in order: the i-th key is row V + 1 + i, so a reader needs no scan, only the count
and the keys past the ones it holds. A scorer reads them after each catch-up of its store view
(``offgraph.scoring.scorer``), the trainer and the updater when they open the version.
"""

from __future__ import annotations

from offgraph.store.base import EmbeddingStore

__all__ = ["appends_meta", "read_appended"]


def _count_key(table_id: int) -> bytes:
    return f"vocabulary/{int(table_id)}/n".encode()


def _key(table_id: int, i: int) -> bytes:
    return f"vocabulary/{int(table_id)}/{int(i)}".encode()


def appends_meta(table_id: int, have: int, keys: list[str]) -> dict[bytes, bytes]:
    """The meta records that append ``keys`` to field ``table_id``'s ``have`` appended keys."""
    out = {_key(table_id, have + i): k.encode("utf-8") for i, k in enumerate(keys)}
    out[_count_key(table_id)] = str(have + len(keys)).encode()
    return out


def read_appended(store: EmbeddingStore, table_id: int, have: int = 0) -> list[str]:
    """The keys appended to field ``table_id`` past the first ``have``, in row order. Read from the shard that
    holds the most: a crash between the shards' batches of one write leaves some a write behind until the
    updater re-applies it to them."""
    counts = [int(v) if v else 0 for v in store.get_meta_per_shard(_count_key(table_id))]
    n = max(counts, default=0)
    if n <= have:
        return []
    shard = counts.index(n)
    values = store.get_metas([_key(table_id, i) for i in range(have, n)], shard)
    if any(v is None for v in values):
        raise ValueError(f"corrupt store {store.path}: shard {shard} counts {n} keys appended to table {table_id}")
    return [v.decode("utf-8") for v in values]  # type: ignore[union-attr]
