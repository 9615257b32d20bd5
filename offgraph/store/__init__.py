"""offgraph embedding store: (table id, row) -> (vector, first-order weight), sharded,
quantized, on disk (RocksDB through rocksdict).

    from offgraph.store import StoreConfig, open_store
    with open_store("store/", StoreConfig(dim=16, quant="int8", shards=8), mode="w") as st:
        st.bulk_load(table_id, chunks)          # (rows, vectors, first_order) chunks
    with open_store("store/") as st:            # read-only
        vectors, first_order = st.read(table_ids, rows)
"""

from offgraph.store.base import EmbeddingStore, ReadResult, WriteResult
from offgraph.store.config import StoreConfig
from offgraph.store.errors import StoreReadError, StoreRemoteError, StoreUnavailable
from offgraph.store.keys import SHARD_FN, decode_keys, encode_keys, shard_of
from offgraph.store.open import open_store
from offgraph.store.quant import codec_names, get_codec
from offgraph.store.row_cache import RowCache

__all__ = [
    "StoreConfig",
    "open_store",
    "get_codec",
    "codec_names",
    "EmbeddingStore",
    "ReadResult",
    "WriteResult",
    "StoreReadError",
    "StoreUnavailable",
    "StoreRemoteError",
    "RowCache",
    "encode_keys",
    "decode_keys",
    "shard_of",
    "SHARD_FN",
]
