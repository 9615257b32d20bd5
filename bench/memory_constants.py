"""The two sizes the memory budget counts with, measured: index bytes per data block, FG cache bytes per item.

``offgraph.scoring.memory_budget`` sizes a worker's block cache from the index a version needs
(``INDEX_BYTES_PER_BLOCK`` per data block) and its FG item cache from what an item holds
(``FG_ITEM_BYTES``). This bench measures both here, so the constants can be checked whenever RocksDB,
the key format, the store's options or the FG's cache entry change:

* index: a synthetic version (``offgraph synth``'s own writer) is written to a temporary directory and
  opened read-only; each shard's ``rocksdb.aggregated-table-properties`` gives the index block size
  (partitions and top level) and the number of data blocks of its table files;
* item: ``tracemalloc`` around a ``FeatureGenerator`` of the synth spec taking distinct items into
  its item cache through ``transform`` (serving's path), the candidates built inside the trace and
  dropped after, so what the cache keeps alive of them (its keys' values) counts and nothing else.

    python -m bench.memory_constants --out bench/results/memory-constants
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from offgraph.scoring.memory_budget import FG_ITEM_BYTES, INDEX_BYTES_PER_BLOCK

ROWS = 1_000_000
ITEMS = 20_000
BATCH = 200  # candidates per transform, a request's worth
ITEM_TABLE_ROWS = 10**9  # the spec's size for the item draw: uniform ids over it are (almost) all distinct
COMMAND = "python -m bench.memory_constants --out bench/results/memory-constants"


def table_properties(text: str) -> dict[str, str]:
    """``rocksdb.aggregated-table-properties`` (``name=value; ...``) as a dict."""
    return {k.strip(): v.strip() for k, v in (p.split("=", 1) for p in text.split(";") if "=" in p)}


def store_index(store_dir: str | Path) -> dict[str, Any]:
    """Index bytes and data blocks over all shards of the store at ``store_dir`` (opened read-only)."""
    from offgraph.store import open_store
    from offgraph.store.rocksdb_store import RocksDBBackend

    index = blocks = entries = 0
    with open_store(store_dir, mode="r") as st:
        assert isinstance(st.storage, RocksDBBackend)  # the table properties are RocksDB's
        for s in range(st.config.shards):
            props = table_properties(st.property_value(s, "rocksdb.aggregated-table-properties") or "")
            index += int(next(v for k, v in props.items() if k.startswith("index block size")))
            blocks += int(props["# data blocks"])
            entries += int(props["# entries"])
        block_size_kb = st.config.block_size_kb
    return {
        "index_bytes": index,
        "data_blocks": blocks,
        "entries": entries,
        "block_size_kb": block_size_kb,
        "index_bytes_per_block": index / blocks,
    }


def measure_index(rows: int = ROWS, workdir: str | Path | None = None) -> dict[str, Any]:
    """Write a ``rows``-row synthetic version and measure its store's index (:func:`store_index`), with the
    planner's estimate of the same version (``manifest_index_mb``) beside it."""
    from offgraph.export.synth import synth_version
    from offgraph.export.synth_config import SynthConfig
    from offgraph.scoring.memory_budget import MiB, manifest_index_mb

    with tempfile.TemporaryDirectory(prefix="memory-constants-", dir=workdir) as tmp:
        version = Path(tmp) / "models" / "synth" / "1"
        t0 = time.perf_counter()
        manifest = synth_version(version, SynthConfig(rows=rows), progress=False)
        got = store_index(version / "store")
        got["synth_s"] = time.perf_counter() - t0
    got["rows"] = rows
    got["planner_index_bytes"] = manifest_index_mb(manifest) * MiB
    return got


def item_columns(n: int, seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A request's raw values and ``n`` candidates' columns, uniform over a huge item table (so distinct)."""
    from offgraph.export.traffic import draw_columns

    req, cand = draw_columns(ITEM_TABLE_ROWS, 1, n, "uniform", seed)
    return {k: v[0].item() for k, v in req.items()}, cand


def measure_items(items: int = ITEMS, batch: int = BATCH, seed: int = 0, own_values: bool = True) -> dict[str, Any]:
    """Bytes the FG item cache of the synth spec holds per item, once ``items`` distinct items are in it.

    ``own_values``: the candidates are built inside the trace and dropped after it, as a request's parsed
    JSON is, so the values the cache's keys keep alive count (what serving holds). False: they are built
    before it and stay alive, so only the cache's own objects count."""
    from offgraph.export.synth_spec import synth_spec
    from offgraph.features.fg import FeatureGenerator
    from offgraph.features.spec import parse_spec

    spec = parse_spec(synth_spec(ITEM_TABLE_ROWS), source="bench.memory_constants")
    request, cols = item_columns(items, seed)
    names = list(cols)

    def candidates(lo: int, hi: int) -> list[dict[str, Any]]:
        """Candidates ``lo:hi`` as a request's JSON gives them: Python values of their own."""
        part = {k: cols[k][lo:hi].tolist() for k in names}
        return [{k: part[k][i] for k in names} for i in range(hi - lo)]

    warm = FeatureGenerator(spec, item_cache_size=batch)  # first-call allocations (imports, NumPy) are not the cache's
    warm.transform(request, candidates(0, batch))
    del warm
    built = None if own_values else candidates(0, items)
    fg = FeatureGenerator(spec, item_cache_size=items)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for lo in range(0, items, batch):
            hi = min(items, lo + batch)
            cands = candidates(lo, hi) if built is None else built[lo:hi]
            fg.transform(request, cands)
        del cands
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    cached = len(fg._cache)
    return {"items": cached, "held_bytes": held, "item_bytes": held / cached, "own_values": own_values}


def summary(index: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """Each figure beside the constant in use, and their ratio."""
    return {
        "INDEX_BYTES_PER_BLOCK": {
            "constant": INDEX_BYTES_PER_BLOCK,
            "measured": index["index_bytes_per_block"],
            "ratio": index["index_bytes_per_block"] / INDEX_BYTES_PER_BLOCK,
        },
        "FG_ITEM_BYTES": {
            "constant": FG_ITEM_BYTES,
            "measured": item["item_bytes"],
            "ratio": item["item_bytes"] / FG_ITEM_BYTES,
        },
    }


def describe(result: dict[str, Any]) -> str:
    idx, item = result["index"], result["item"]
    lines = [
        f"index: {idx['index_bytes']:,} bytes over {idx['data_blocks']:,} data blocks of {idx['block_size_kb']} KiB "
        f"({idx['rows']:,} synth rows): {idx['index_bytes_per_block']:.1f} B a block; the planner estimates "
        f"{idx['planner_index_bytes'] / idx['index_bytes']:.2f}x the index measured",
        f"item cache: {item['held_bytes']:,} bytes over {item['items']:,} distinct items: {item['item_bytes']:.0f} B "
        f"an item ({result['item_shared_values']['item_bytes']:.0f} B without the values its keys keep alive)",
    ]
    for name, s in result["summary"].items():
        lines.append(
            f"{name}: constant {s['constant']}, measured {s['measured']:.1f} (measured/constant {s['ratio']:.2f})"
        )
    return "\n".join(lines)


README = """# The memory budget's two sizes, measured

    {command}

`offgraph/scoring/memory_budget.py` counts the block cache's index at `INDEX_BYTES_PER_BLOCK` bytes per
data block and the FG item cache at `FG_ITEM_BYTES` bytes per item. `bench/memory_constants.py` measures
both (how: its docstring); `result.json` holds the figures and the constants they are checked against.

| constant | in use | measured | measured / constant |
|---|---|---|---|
{rows}

- index: {index_bytes:,} bytes of index blocks (partitions and top level) over {data_blocks:,} data blocks of
  {block_size_kb} KiB, from the table properties of a {synth_rows:,}-row synthetic version's store.
  The planner's estimate of the same version's index (`manifest_index_mb`, which counts blocks of
  uncompressed rows and means to over-estimate) is {planner:.2f}x that index.
- item cache: {held:,} bytes held by a `FeatureGenerator` of the synth spec after {items:,} distinct
  items went through `transform` (tracemalloc; the candidates were dropped, as a request's parsed JSON
  is, so the values the cache's keys keep alive count: that is what a serving worker holds). Counting
  the cache's own objects only (the candidates built before the trace and kept), it is
  {shared:.0f} B an item: the difference is the
  item's raw values (its ids, tags, category, brand, age and price).

No plot: two numbers.
"""


def write(out: Path, result: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    idx, item = result["index"], result["item"]
    rows = "\n".join(
        f"| `{name}` | {s['constant']} | {s['measured']:.1f} | {s['ratio']:.2f} |"
        for name, s in result["summary"].items()
    )
    (out / "README.md").write_text(
        README.format(
            command=COMMAND,
            rows=rows,
            index_bytes=idx["index_bytes"],
            data_blocks=idx["data_blocks"],
            block_size_kb=idx["block_size_kb"],
            synth_rows=idx["rows"],
            planner=idx["planner_index_bytes"] / idx["index_bytes"],
            held=item["held_bytes"],
            items=item["items"],
            shared=result["item_shared_values"]["item_bytes"],
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results directory (result.json, README.md)")
    ap.add_argument("--rows", type=int, default=ROWS, help="rows of the synthetic version whose index is measured")
    ap.add_argument("--items", type=int, default=ITEMS, help="distinct items put in the FG item cache")
    ap.add_argument("--workdir", help="where the temporary version is written (default: the system's temp dir)")
    args = ap.parse_args(argv)
    item = measure_items(args.items)
    shared = measure_items(args.items, own_values=False)
    index = measure_index(args.rows, args.workdir)
    result = {"index": index, "item": item, "item_shared_values": shared, "summary": summary(index, item)}
    assert all(math.isfinite(s["measured"]) for s in result["summary"].values())
    print(describe(result), flush=True)
    write(Path(args.out), result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
