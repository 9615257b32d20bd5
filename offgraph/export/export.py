"""`offgraph export`: split a trained run into store/ (tables) + dense/ (head) + manifest.json."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from offgraph.calibration import score_kind
from offgraph.export.dense_saved_model import save_dense
from offgraph.export.hot_set import HotSet, hot_set_of
from offgraph.export.run_split import run_held_out_mask
from offgraph.feature_tables.build import build_feature_tables, manifest_record
from offgraph.features.segment import check_segmenters, segmenters_of
from offgraph.features.spec import FG_VERSION
from offgraph.model.model import CONFIG_FILE, load_run
from offgraph.modeldir.hot_set import write_hot_set
from offgraph.modeldir.layout import DEFAULT_HOT_SET_ROWS
from offgraph.modeldir.manifest import (
    DENSE_DIR,
    FORMAT_VERSION,
    STORE_DIR,
    ModelDirError,
    check_negative_rate,
    check_version_dir,
    digest,
    file_sha256,
    sampled_negative_rate,
    store_file_records,
    training_loss,
    tree_checksums,
    version_file_records,
    write_manifest,
)
from offgraph.modeldir.manifest_model import Manifest
from offgraph.store import StoreConfig, open_store
from offgraph.store.open import backend_location, delete_remote_rows
from offgraph.store.redis_store import cluster_url
from offgraph.store.store_file import read_store_file

log = logging.getLogger("offgraph.export")

CHUNK_ROWS = 1 << 18


def _check_run(model, spec, metrics, run_dir: Path) -> None:
    d = spec.model.embedding_dim
    for i, f in enumerate(spec.fields):
        e = tuple(model.front.emb_tables[i].embeddings.shape)
        w = tuple(model.front.w_tables[i].embeddings.shape)
        if e != (f.rows, d) or w != (f.rows, 1):
            raise ValueError(
                f"run {run_dir}: field '{f.name}': the model's tables are {e} and {w} but the spec "
                f"says rows={f.rows}, embedding_dim={d}"
            )
    trained_rows = metrics.get("table_rows")
    if trained_rows is not None and trained_rows != {f.name: f.rows for f in spec.fields}:
        raise ValueError(
            f"run {run_dir}: spec.yaml's fields differ from the ones the model was trained with ({trained_rows})"
        )
    fgv = metrics.get("fg_version")
    if fgv is not None and fgv != FG_VERSION:
        raise ValueError(
            f"run {run_dir}: trained with FG version {fgv!r}, this offgraph hashes with "
            f"{FG_VERSION!r}: refusing to export rows that would be looked up differently"
        )


def _chunks(emb_var, w_var, rows: int):
    for s in range(0, rows, CHUNK_ROWS):
        e = min(rows, s + CHUNK_ROWS)
        yield (
            np.arange(s, e, dtype=np.int64),
            np.asarray(emb_var[s:e], dtype=np.float32),
            np.asarray(w_var[s:e], dtype=np.float32)[:, 0],
        )


def _run_config(run_dir: Path) -> dict | None:
    """The run's train_config.json (a run written by hand may have metrics without its config: its loss says
    what the scores are)."""
    try:
        config = json.loads((run_dir / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def version_store_config(out: Path, backend: str = "rocksdb", **settings) -> StoreConfig:
    """The store settings of a new version ``out`` on ``backend`` (``offgraph.store.open.backend_location``),
    to be called before :func:`prepare_version_dir`. A remote backend's rows are keyed by a namespace,
    ``NAME/VERSION/`` and a random suffix; an export interrupted in ``out`` left one, which is taken
    again when its layout matches (the rows are rewritten in place: nothing is left in the cluster),
    else its rows are deleted first."""
    location = backend_location(backend)
    if location["backend"] == "rocksdb":
        return StoreConfig(**settings, **location)
    try:  # every node as a seed: the version's readers and writers start while any node answers
        location["url"] = cluster_url(location["url"])
    except Exception as e:  # noqa: BLE001 - redis-py's errors: say which cluster did not answer
        raise OSError(f"cannot reach the Redis Cluster at {backend}: {e}") from None
    config = StoreConfig(**settings, **location)
    prior = read_store_file(os.fspath(out / STORE_DIR)) if (out / STORE_DIR).is_dir() else None
    if prior is not None and prior.backend == config.backend and prior.namespace:
        if prior.replace(url=config.url).layout() == config.replace(namespace=prior.namespace).layout():
            log.info("%s: resuming the interrupted export into namespace %s", out, prior.namespace)
            return config.replace(namespace=prior.namespace)
        delete_remote_rows(out / STORE_DIR, prior.replace(url=config.url))
    return config.replace(namespace=f"{out.parent.name}/{out.name}/{secrets.token_hex(4)}")


def prepare_version_dir(out: Path) -> None:
    """:func:`check_version_dir`, then remove an incomplete version left by an interrupted write."""
    check_version_dir(out)
    if out.exists():
        log.warning("removing %s: an incomplete version left by an interrupted export", out)
        shutil.rmtree(out)
    out.mkdir(parents=True)


VOCABULARY_DIR = "vocabulary"


def copy_vocabularies(out: Path, spec) -> dict[str, dict]:
    """Copy each vocabulary field's file into ``out/vocabulary/FIELD.txt``; returns the manifest's
    ``vocabularies`` record: per field its path in the version, sha256 and key count."""
    records = {}
    for f in spec.fields:
        if f.vocabulary is None:
            continue
        rel = f"{VOCABULARY_DIR}/{f.name}.txt"
        (out / VOCABULARY_DIR).mkdir(exist_ok=True)
        shutil.copyfile(f.vocabulary.source, out / rel)
        if file_sha256(out / rel) != f.vocabulary.sha256:  # the file changed since the spec read it
            raise ValueError(
                f"field '{f.name}': vocabulary {f.vocabulary.source} changed while the version was written"
            )
        records[f.name] = {"path": rel, "sha256": f.vocabulary.sha256, "keys": f.vocabulary.size}
    return records


def unknown_in_reserved(f, chunks):
    """A vocabulary field's chunks with the rows reserved for appended keys (``capacity``) holding the unknown
    row's values: an id appended before its own row is trained scores as it did on the unknown row."""
    if not f.capacity:
        return chunks
    start = f.appendable.start

    def filled():
        unknown = None
        for rows, v, w in chunks:
            if unknown is None:  # ascending rows: the first chunk starts at row 0, the unknown row
                unknown = (np.array(v[0], np.float32), np.float32(w[0]))
            m = rows >= start
            if m.any():
                v, w = np.array(v, np.float32), np.array(w, np.float32)
                v[m], w[m] = unknown
            yield rows, v, w

    return filled()


def write_version(
    out: Path,
    spec,
    head,
    tables,
    *,
    config: StoreConfig,
    training: dict,
    progress: bool = True,
    workers: int | None = None,
    segmenters: dict | None = None,
    hot_set: HotSet | None = None,
    split: bool = True,
) -> Manifest:
    """Write a version into the prepared directory ``out``: the store, bulk-loaded from ``tables``
    (per field in spec order, chunks ``(rows, vectors, first_order)`` in ascending rows), the dense
    SavedModel of ``head``, the ``hot_set`` when given (``offgraph.modeldir.hot_set``), then the
    manifest (last, by rename). ``segmenters``: those the model was trained with (default: the
    spec's, as this library has them). ``split``: write the dense head's split signature when the spec has
    request-scope fields (it needs offgraph's own DeepFM head; an imported head is served whole). A
    vocabulary field's file is copied into ``vocabulary/`` and the manifest's spec refers to the copy.
    Returns the manifest."""
    t0 = time.perf_counter()
    d = spec.model.embedding_dim
    fields, row_counts = [], {}
    with open_store(out / STORE_DIR, config, mode="w") as store:
        loaded = store.bulk_load_tables(
            [(i, unknown_in_reserved(f, t)) for i, (f, t) in enumerate(zip(spec.fields, tables))],
            total_rows=sum(f.rows for f in spec.fields),
            progress=progress,
            workers=workers,
        )
        for i, f in enumerate(spec.fields):
            row_counts[f.name] = loaded[i]
            fields.append(
                {"name": f.name, "table_id": i, "rows": f.rows, "scope": f.scope, "op": f.op, "pooling": f.pooling}
            )
        store.flush()
        store_stats = store.stats()
    store_seconds = time.perf_counter() - t0
    scopes = [f.scope for f in spec.fields] if split else None
    dense = save_dense(head, len(spec.fields), d, out / DENSE_DIR, num_dense=len(spec.numeric), scopes=scopes)
    vocabularies = copy_vocabularies(out, spec)
    checksums = {"dense": tree_checksums(out / DENSE_DIR)}
    checksums["dense_digest"] = digest(checksums["dense"])
    checksums["store_files"] = store_file_records(out / STORE_DIR)
    hot = write_hot_set(out, *hot_set) if hot_set is not None and len(hot_set.rows) else None
    checksums["files"] = version_file_records(out)  # last: every file is written
    manifest = {
        "format_version": FORMAT_VERSION,
        "fg_version": FG_VERSION,
        "hash": spec.model.hash,
        "embedding_dim": d,
        "fields": fields,
        # numeric fields: column j of the dense [N, k] input, with the statistics training computed
        "dense_inputs": [{"name": f.name, "scope": f.scope, "input": f.input, **f.params} for f in spec.numeric],
        # segmenter (and library version) of each tokenize field at training: a scorer with another refuses
        "segmenters": segmenters if segmenters is not None else segmenters_of(spec),
        "spec": spec.with_vocabulary_paths({k: v["path"] for k, v in vocabularies.items()}),
        # each vocabulary field's keys (its rows 1..V), a file of the version, with the checksum of its bytes
        **({"vocabularies": vocabularies} if vocabularies else {}),
        "calibration": vars(spec.model.calibration),
        # the loss, and so what a score is: "ctr" (a calibrated probability) or "ranking" (a listwise model
        # without a fitted calibration); read by offgraph.scoring.scorer, which derives both for manifests without them
        "training_loss": (loss := training_loss({"training": training})),
        "score_kind": score_kind(loss, spec.model.calibration),
        **({"feature_tables": manifest_record(spec)} if spec.tables else {}),  # shared by versions: ../features
        "store": {
            **config.to_dict(),
            "path": STORE_DIR,
            "row_counts": row_counts,
            "bytes_on_disk": store_stats["bytes_on_disk"],
        },
        # split: the request and candidate field indices of the signature that takes the request part once
        "dense": {"path": DENSE_DIR, **dense},
        "training": training,
        "checksums": checksums,
        "created_at": datetime.now(UTC).isoformat(),
        "export_seconds": {"store": store_seconds, "total": time.perf_counter() - t0},
        **({"hot_set": hot} if hot is not None else {}),
    }
    checked = Manifest.from_json(json.dumps(manifest))  # what a reader will get: a writer's slip fails here
    write_manifest(out, manifest)
    return checked


def export_run(
    run_dir: str | Path,
    out_dir: str | Path,
    shards: int = 8,
    quant: str = "int8",
    block_cache_mb: int = 64,
    progress: bool = True,
    feature_data=None,
    feature_source: str = "<data>",
    feature_rows: str = "training",
    backend: str = "rocksdb",
    hot_set_data=None,
    hot_set_source: str = "<data>",
    hot_set_rows: int = DEFAULT_HOT_SET_ROWS,
) -> Manifest:
    """Export RUN into a version directory MODELS/NAME/VERSION; returns the manifest. ``backend``: where
    the store's rows live, ``"rocksdb"`` (the version directory) or ``"redis://HOST:PORT"`` (a Redis
    Cluster; the directory holds the store's settings).

    The spec's feature tables (MODELS/NAME/features/, shared by versions) are created before the
    manifest is written; with ``feature_data`` (a pyarrow table: the run's training file) they are
    loaded with the latest value per key of its ``feature_rows``: "training" (the run's training
    rows: what was known before the held-out cut) or "all".

    With ``hot_set_data`` (a pyarrow table: the run's training file) the version records its static
    hot set: the ``hot_set_rows`` rows its training rows (those before the held-out cut) look up most
    (``offgraph.export.hot_set``), which a server seeds its row cache with when it starts."""
    run_dir, out = Path(run_dir), Path(out_dir)
    check_version_dir(out)  # before the run is read
    backend_location(backend)  # likewise
    model, spec, metrics = load_run(run_dir)
    _check_run(model, spec, metrics, run_dir)
    check_segmenters(spec, metrics.get("segmenters"), f"run {run_dir}")
    run_config = metrics.get("config") or _run_config(run_dir)
    check_negative_rate(
        spec.model.calibration.negative_rate, sampled_negative_rate({"config": run_config}), f"run {run_dir}"
    )
    if feature_rows not in ("training", "all"):
        raise ValueError(f"feature_rows must be 'training' or 'all', got {feature_rows!r}")
    if isinstance(hot_set_rows, bool) or not isinstance(hot_set_rows, int) or hot_set_rows < 0:
        raise ValueError(f"hot_set_rows must be an int >= 0, got {hot_set_rows!r}")
    hot_set = None
    if hot_set_data is not None and hot_set_rows > 0:  # before anything is written: bad data fails first
        train = ~run_held_out_mask(run_dir, spec, hot_set_data)
        hot_set = hot_set_of(spec, hot_set_data, hot_set_rows, train, source=hot_set_source, progress=progress)
    config = version_store_config(
        out, backend, dim=spec.model.embedding_dim, quant=quant, shards=shards, block_cache_mb=block_cache_mb
    )
    prepare_version_dir(out)
    if spec.tables:
        mask = None
        if feature_data is not None and feature_rows == "training":
            mask = ~run_held_out_mask(run_dir, spec, feature_data)
        build_feature_tables(out.parent, spec, feature_data, mask, source=feature_source, progress=progress)
    tables = [
        _chunks(model.front.emb_tables[i].embeddings.value, model.front.w_tables[i].embeddings.value, f.rows)
        for i, f in enumerate(spec.fields)
    ]
    training = {
        "held_out": metrics.get("held_out"),
        "train_rows": metrics.get("train_rows"),
        "config": run_config,
        "run": str(run_dir.resolve()),
        # a listwise run's calibration fit: a, b, mean score and logloss before and after it
        **({"calibration": metrics["calibration"]} if metrics.get("calibration") else {}),
    }
    manifest = write_version(
        out,
        spec,
        model.head,
        tables,
        config=config,
        training=training,
        progress=progress,
        segmenters=metrics.get("segmenters") or segmenters_of(spec),
        hot_set=hot_set,
    )
    total_rows = manifest.store.total_rows
    store_seconds = manifest.export_seconds.store
    log.debug(  # the command line prints its own summary
        "exported %s -> %s: %d rows in %d tables, %s x %d shards, %.1fs (%.0f rows/s)",
        run_dir,
        out,
        total_rows,
        len(manifest.fields),
        quant,
        shards,
        store_seconds,
        total_rows / max(store_seconds, 1e-9),
    )
    return manifest


__all__ = ["export_run", "write_version", "check_version_dir", "prepare_version_dir", "ModelDirError"]
