"""Entity feature tables: the rows (a user's profile, an item's catalog entry) the server joins into
ids-only requests, kept in one small RocksDB per table shared by a model's versions.

Everything about them lives here (``offgraph/feature_tables/README.md``); the spec's ``tables:``
section is parsed with the rest of the spec (``offgraph.features.table_spec``), and a feature
delta's wire format lives with the other delta kinds (``offgraph.streaming.deltas``). Import the
modules themselves: this package imports nothing, so ``import offgraph.feature_tables.checks``
does not load RocksDB's bindings through a front.
"""
