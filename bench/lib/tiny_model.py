"""A small MovieLens DeepFM for the benches that measure the server around the model, not the model: the tests'
tiny model's recipe (``examples/movielens.yaml`` with tables 1/50 of the example's, 1 epoch on the first ``rows``
ratings), exported fp32 as ``MODELS/NAME/1``."""

from __future__ import annotations

from pathlib import Path


def build_model(root: Path, rows: int, name: str = "ml") -> tuple[Path, Path]:
    """(MODELS with NAME/1, the MovieLens table's parquet), built under ``root``."""
    import pyarrow.parquet as pq
    import yaml

    from offgraph.data.datasets import build
    from offgraph.export.export import export_run
    from offgraph.features import parse_spec
    from offgraph.model.train import TrainConfig, train_run

    data = build("movielens-100k", root / "data")
    table = pq.read_table(data).slice(0, rows)
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "movielens.yaml").read_text())
    for f in raw["fields"]:
        if "rows" in f:
            f["rows"] = max(16, f["rows"] // 50)
    spec = parse_spec(raw, source="bench movielens")
    train_run(spec, table, TrainConfig(epochs=1, batch_size=512, split="per-key-time"), root / "run", progress=False)
    export_run(root / "run", root / "models" / name / "1", shards=2, quant="fp32", progress=False)
    return root / "models", data
