"""Feature spec, feature generation and hashing: the one place training and serving share."""

from offgraph.features.fg import FeatureGenerator, FGBatch, RaggedIds
from offgraph.features.ops import FeatureValueError
from offgraph.features.pooling import pool_numpy
from offgraph.features.spec import FG_VERSION, FeatureSpec, FieldSpec, SpecError, load_spec, parse_spec

__all__ = [
    "FG_VERSION",
    "FeatureGenerator",
    "FGBatch",
    "RaggedIds",
    "FeatureSpec",
    "FieldSpec",
    "FeatureValueError",
    "SpecError",
    "load_spec",
    "parse_spec",
    "pool_numpy",
]
