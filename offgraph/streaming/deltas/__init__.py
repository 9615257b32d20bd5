"""Delta files and messages, format version 1 (offgraph/streaming/README.md, "Delta files" and
"Feature deltas"): row deltas (``rows``), feature-row deltas (``features``), spool names and
publishing (``spool``), and :func:`read`, which returns the batch of a file's kind. Import from here:
the ``_format`` module (the Arrow schema and checks) is private to this package.

    publish_delta(spool, model="ml", model_version=3, table_ids=t, rows=r, vectors=v,
                  first_order=w, seqs=s, event_time_ms=now_ms)
    batch = read(path_or_bytes)     # DeltaBatch | FeatureDeltaBatch
"""

from offgraph.streaming.deltas._format import (
    COLUMNS,
    FORMAT_VERSION,
    KIND_FEATURES,
    META_DIM,
    META_KIND,
    META_MODEL,
    META_MODEL_VERSION,
    META_VERSION,
    SUFFIX,
    DeltaFormatError,
    count_rows,
)
from offgraph.streaming.deltas._format import build_table as build_row_table
from offgraph.streaming.deltas._format import schema as row_schema
from offgraph.streaming.deltas.features import FeatureDeltaBatch, encode_feature_delta, publish_feature_delta
from offgraph.streaming.deltas.features import build_table as build_feature_table
from offgraph.streaming.deltas.reader import AnyDeltaBatch, read
from offgraph.streaming.deltas.rows import DeltaBatch, encode_delta, write_delta_file
from offgraph.streaming.deltas.spool import parse_spool_name, publish_delta, publish_file, spool_file_name

__all__ = [
    "AnyDeltaBatch",
    "COLUMNS",
    "DeltaBatch",
    "DeltaFormatError",
    "FORMAT_VERSION",
    "FeatureDeltaBatch",
    "KIND_FEATURES",
    "META_DIM",
    "META_KIND",
    "META_MODEL",
    "META_MODEL_VERSION",
    "META_VERSION",
    "SUFFIX",
    "build_feature_table",
    "build_row_table",
    "count_rows",
    "encode_delta",
    "encode_feature_delta",
    "parse_spool_name",
    "publish_delta",
    "publish_feature_delta",
    "publish_file",
    "read",
    "row_schema",
    "spool_file_name",
    "write_delta_file",
]
