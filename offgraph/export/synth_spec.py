"""The feature spec of a synthetic model (`offgraph synth`): a few huge id tables, many small ones.

Realistic shape of a CTR model: most rows are in a few id tables (users, items, authors, tags),
whose sizes grow with the model; the rest are small tables of fixed cardinality (countries,
devices, hours, categories, price buckets) that do not grow. ``synth_spec(total_rows)`` gives
the small tables their fixed sizes and splits the rest of ``total_rows`` between the huge ones
by fixed shares, so the tables add up to exactly ``total_rows``.

Every raw input is named as its field. The id fields hash their raw value (any int or str) to
``xxh64(canonical) mod rows``: a bench or a test that wants a row popularity draws raw ids with
that popularity (hashing scatters distinct raw ids over distinct rows, collisions aside).
"""

from __future__ import annotations

import math
from typing import Any

# (name, scope, share of the rows left after the small tables); the last one takes the remainder
HUGE_TABLES: tuple[tuple[str, str, float], ...] = (
    ("user_id", "request", 0.45),
    ("item_id", "item", 0.33),
    ("author_id", "item", 0.14),
    ("item_tags", "item", 0.08),  # a list of tags per item, mean-pooled
)
# (name, scope, op, rows, extra parameters): fixed cardinalities
SMALL_TABLES: tuple[tuple[str, str, str, int, dict[str, Any]], ...] = (
    ("country", "request", "id", 256, {}),
    ("city", "request", "id", 8192, {}),
    ("device_model", "request", "id", 4096, {}),
    ("os", "request", "id", 16, {}),
    ("app_version", "request", "id", 512, {}),
    ("language", "request", "id", 256, {}),
    ("hour", "request", "id", 24, {}),
    ("weekday", "request", "id", 8, {}),
    ("category", "item", "id", 1024, {}),
    ("brand", "item", "id", 4096, {}),
    ("price", "item", "log_bucket", 64, {"base": 2}),
    ("item_age_days", "item", "bucketize", 16, {"boundaries": [1, 2, 4, 7, 14, 30, 60, 90, 180, 365]}),
)
SMALL_ROWS = sum(t[3] for t in SMALL_TABLES)
MIN_HUGE_ROWS = 1024
# the smallest share must still get MIN_HUGE_ROWS
MIN_TOTAL_ROWS = SMALL_ROWS + math.ceil(MIN_HUGE_ROWS / min(share for _, _, share in HUGE_TABLES))
TAGS_PER_ITEM = 3
MLP = (128, 64)


def huge_table_rows(total_rows: int) -> dict[str, int]:
    """Rows of each huge table for a model of ``total_rows`` rows in all."""
    if total_rows < MIN_TOTAL_ROWS:
        raise ValueError(
            f"a synthetic model needs at least {MIN_TOTAL_ROWS:,} rows ({SMALL_ROWS:,} in its "
            f"{len(SMALL_TABLES)} small tables, the rest shared by its {len(HUGE_TABLES)} huge ones, "
            f"{MIN_HUGE_ROWS} rows at least each), got {total_rows:,}"
        )
    left = total_rows - SMALL_ROWS
    out = {name: int(left * share) for name, _, share in HUGE_TABLES[:-1]}
    out[HUGE_TABLES[-1][0]] = left - sum(out.values())
    return out


def synth_spec(total_rows: int, dim: int = 16, hash_name: str = "xxh64") -> dict[str, Any]:
    """The raw spec (as YAML would give it) of a synthetic model of ``total_rows`` rows."""
    huge = huge_table_rows(total_rows)
    fields: list[dict[str, Any]] = []
    for name, scope, _ in HUGE_TABLES:
        f = {"name": name, "scope": scope, "op": "id", "input": name, "rows": huge[name]}
        if name == "item_tags":
            f["max_values"] = 64
        fields.append(f)
    for name, scope, op, rows, extra in SMALL_TABLES:
        fields.append({"name": name, "scope": scope, "op": op, "input": name, "rows": rows, **extra})
    return {
        "model": {"embedding_dim": dim, "hash": hash_name, "mlp": list(MLP), "pooling": "mean"},
        "label": "label",
        "item_key": "item_id",
        "fields": fields,
    }
