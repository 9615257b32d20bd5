"""`offgraph import`: a version built from a model trained elsewhere (a parameter server, TFRA, TorchRec, a
plain Keras script), in the format `offgraph export` writes (``write_version``).

What it takes, beside the spec (the FG: how raw values map to rows, by hashing or by a vocabulary):

- per-field tables, Parquet or Arrow IPC files named ``FIELD.parquet`` / ``FIELD.arrow`` (a directory of
  them, or the files), columns ``row`` (int, 0..rows-1) or ``key`` (string: a vocabulary field's key, null
  for the unknown row 0, which is zeros when no row has a null key), ``vector`` (list<float> of D) and
  ``first_order`` (float); every row of the field's table once;
- the dense head: a SavedModel whose ``serving_default`` takes ``emb`` [N, F, D], ``first_order`` [N, F]
  (and ``dense`` [N, k] when the spec has k numeric fields) and returns ``logit`` (or one output, taken
  as the logit) — the signature `offgraph export` writes — or a Keras file taking ``[emb, first_order(,
  dense)]`` in that order and returning the logit;
- or instead of both, one Keras model file: per field an ``Embedding`` layer named ``FIELD_emb`` (D wide,
  ``rows`` rows) and one named ``FIELD_first_order`` (1 wide), each called on the field's one id a row
  ([N] or [N, 1]), numeric fields as one float input [N, k], and a sigmoid last (a ``Dense(1,
  activation="sigmoid")``, an ``Activation("sigmoid")`` or ``ops.sigmoid``: the head keeps the logit
  before it) or the logit. The importer takes the tables from the embedding layers and rebuilds the rest
  of the graph on ``emb`` / ``first_order`` / ``dense`` inputs (the embeddings' outputs replaced by
  slices of them), sharing the layers' weights.

Everything is refused before a version directory is made, naming the part: a table whose width is not D,
a table's rows not those of the spec (a count, a row out of range, twice, a key the vocabulary lacks), a
field without a table or a table for no field, a dense head whose call on zeros of the contract's shapes
fails or does not give one score a row, a vocabulary with a duplicate key (the spec's parse).

The version's ``training`` record says where it came from (``imported``: the spec's, tables' and head's
paths and sha256). :class:`SourceReference` scores rows from those sources, with NumPy lookups of the
source tables and the source head: `offgraph check` compares it with the served scores of the version
(``offgraph.export.check``), and ``import_model(check_rows=...)`` does so before it returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from offgraph.modeldir.manifest import file_sha256, tree_checksums

log = logging.getLogger("offgraph.export")

TABLE_SUFFIXES = (".parquet", ".arrow", ".feather", ".ipc")
KERAS_SUFFIXES = (".keras", ".h5")
EMB_SUFFIX, FIRST_ORDER_SUFFIX = "_emb", "_first_order"
"""Names of a whole Keras model's embedding layers: FIELD_emb (D wide) and FIELD_first_order (1 wide)."""


class ImportRefused(ValueError):
    """Artifacts that do not make the spec's model; the message names the part."""


@dataclass(frozen=True)
class FieldTable:
    """One field's rows: ``vectors`` float32 [rows, D], ``first_order`` float32 [rows]."""

    vectors: np.ndarray
    first_order: np.ndarray

    def chunks(self, chunk_rows: int):
        """``write_version``'s chunks ``(rows, vectors, first_order)`` in ascending rows."""
        n = len(self.vectors)
        for s in range(0, n, chunk_rows):
            e = min(n, s + chunk_rows)
            yield np.arange(s, e, dtype=np.int64), self.vectors[s:e], self.first_order[s:e]


# -- tables ------------------------------------------------------------------------------------------------
def table_files(spec, sources: list[str | Path]) -> dict[str, Path]:
    """Each field's table file among ``sources`` (directories of FIELD.parquet / FIELD.arrow files, or the
    files); ImportRefused for a field without one, a file for no field, or two files for one field."""
    files: list[Path] = []
    for s in map(Path, sources):
        if s.is_dir():
            files += sorted(p for p in s.iterdir() if p.suffix in TABLE_SUFFIXES)
        elif s.suffix in TABLE_SUFFIXES and s.is_file():
            files.append(s)
        else:
            raise ImportRefused(f"tables: {s} is neither a directory nor a {'/'.join(TABLE_SUFFIXES)} file")
    by_field: dict[str, Path] = {}
    names = set(spec.field_names)
    for p in files:
        if p.stem not in names:
            raise ImportRefused(f"table {p}: the spec has no field {p.stem!r} (its fields: {spec.field_names})")
        if p.stem in by_field:
            raise ImportRefused(f"field '{p.stem}': two tables, {by_field[p.stem]} and {p}")
        by_field[p.stem] = p
    missing = [n for n in spec.field_names if n not in by_field]
    if missing:
        raise ImportRefused(
            f"field '{missing[0]}': no table among {[str(s) for s in sources]} (expected {missing[0]}.parquet or .arrow)"
        )
    return by_field


def _read_arrow(path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix == ".parquet":
            return pq.read_table(path)
        try:
            with pa.ipc.open_file(path) as r:
                return r.read_all()
        except pa.ArrowInvalid:  # the stream format
            with pa.ipc.open_stream(path) as r:
                return r.read_all()
    except (OSError, pa.ArrowException) as e:
        raise ImportRefused(f"table {path}: cannot read: {e}") from None


def field_table(spec, f, table, source: str) -> FieldTable:
    """The rows of field ``f`` in the Arrow ``table`` (columns row or key, vector, first_order), checked."""
    import pyarrow as pa
    import pyarrow.compute as pc

    d = spec.model.embedding_dim
    where = f"table {source} (field '{f.name}')"
    cols = set(table.column_names)
    for c in ("vector", "first_order"):
        if c not in cols:
            raise ImportRefused(f"{where}: no column {c!r} (columns: {sorted(cols)})")
    if ("row" in cols) == ("key" in cols):
        raise ImportRefused(f"{where}: needs one of the columns 'row' (row index) or 'key' (vocabulary key)")
    vec = table.column("vector").combine_chunks()
    if not (pa.types.is_list(vec.type) or pa.types.is_large_list(vec.type) or pa.types.is_fixed_size_list(vec.type)):
        raise ImportRefused(f"{where}: column 'vector' must be a list of floats, got {vec.type}")
    if vec.null_count:
        raise ImportRefused(f"{where}: column 'vector' has {vec.null_count} null rows")
    widths = pc.list_value_length(vec).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(widths != d)
    if len(bad):
        raise ImportRefused(
            f"{where}: vectors are {int(widths[bad[0]])} wide (row {int(bad[0])} of the file), but the spec's "
            f"embedding_dim is {d}"
        )
    values = pc.list_flatten(vec).to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(vec), d)
    fo_col = table.column("first_order")
    if fo_col.null_count:
        raise ImportRefused(f"{where}: column 'first_order' has {fo_col.null_count} null rows")
    fo = fo_col.to_numpy().astype(np.float32).reshape(-1)
    if "row" in cols:
        rows = table.column("row").to_numpy().astype(np.int64)
        # a vocabulary field's rows reserved for appended keys (capacity) may be left out: the unknown row's values
        expected = f.rows if len(rows) == f.rows else f.rows - f.capacity
    else:
        if f.vocabulary is None:
            raise ImportRefused(f"{where}: keyed by 'key', but field '{f.name}' has no vocabulary (give 'row')")
        keys = table.column("key").cast(pa.string()).to_pylist()
        known = [k for k in keys if k is not None]
        rows = np.zeros(len(keys), np.int64)
        at = np.flatnonzero([k is not None for k in keys])
        rows[at] = f.vocabulary.rows_of(known)
        lost = np.flatnonzero(rows[at] == 0)
        if len(lost):
            raise ImportRefused(f"{where}: key {known[int(lost[0])]!r} is not in the vocabulary {f.vocabulary.source}")
        # the unknown row may be left out (zeros); the rows reserved for appended keys are
        expected = f.rows - f.capacity - (0 if len(at) < len(keys) else 1)
    if len(rows) != expected:
        reserved = f" and {f.capacity:,} reserved for appended keys, which may be left out" if f.capacity else ""
        raise ImportRefused(
            f"{where}: {len(rows):,} rows, but the spec's table has {f.rows:,} (rows: {f.rows}{reserved})"
        )
    if len(rows) and (rows.min() < 0 or rows.max() >= f.rows):
        bad_row = int(rows[(rows < 0) | (rows >= f.rows)][0])
        raise ImportRefused(f"{where}: row {bad_row} is outside the spec's rows 0..{f.rows - 1}")
    seen = np.bincount(rows, minlength=f.rows)
    if (seen > 1).any():
        raise ImportRefused(f"{where}: row {int(np.flatnonzero(seen > 1)[0])} is given twice")
    vectors = np.zeros((f.rows, d), np.float32)
    first = np.zeros(f.rows, np.float32)
    vectors[rows], first[rows] = values, fo
    return FieldTable(vectors, first)


def read_tables(spec, sources: list[str | Path]) -> list[FieldTable]:
    """Every field's table, in spec order."""
    files = table_files(spec, sources)
    return [field_table(spec, f, _read_arrow(files[f.name]), str(files[f.name])) for f in spec.fields]


# -- dense heads -------------------------------------------------------------------------------------------
def _tf_head(fn, keep):
    """A tf.Module head ``head((emb, first_order[, dense]), training=False)`` -> logit [N] from ``fn`` (a
    callable of the same tuple); ``keep``: what holds the variables (saved with it)."""
    import tensorflow as tf

    class _Head(tf.Module):
        def __init__(self):
            super().__init__(name="imported_head")
            self.source = keep

        def raw(self, inputs):  # the source's own output, before the reshape to [N]
            return fn(tuple(inputs))

        def __call__(self, inputs, training=False):
            return tf.reshape(fn(tuple(inputs)), [-1])

    return _Head()


def _saved_model_head(path: Path, num_dense: int):
    import tensorflow as tf

    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as e:  # noqa: BLE001 - TensorFlow's errors are many: name the head
        raise ImportRefused(f"dense head {path}: cannot load the SavedModel: {e}") from None
    sig = loaded.signatures.get("serving_default")
    if sig is None:
        raise ImportRefused(f"dense head {path}: no serving_default signature")
    names = sorted(sig.structured_input_signature[1])
    want = sorted(["emb", "first_order"] + (["dense"] if num_dense else []))
    if names != want:
        raise ImportRefused(f"dense head {path}: its signature takes {names}, the spec's model needs {want}")
    outputs = list(sig.structured_outputs)

    def call(parts):
        kw = {"emb": parts[0], "first_order": parts[1], **({"dense": parts[2]} if num_dense else {})}
        out = sig(**kw)
        return out["logit"] if "logit" in out else out[outputs[0]]

    if "logit" not in outputs and len(outputs) != 1:
        raise ImportRefused(f"dense head {path}: outputs {outputs}: expected 'logit' or a single output")
    return _tf_head(call, loaded)


def _load_keras(path: Path):
    import keras

    try:
        return keras.models.load_model(path, compile=False)
    except Exception as e:  # noqa: BLE001 - Keras' errors are many: name the file
        raise ImportRefused(f"{path}: cannot load the Keras model: {e}") from None


def _keras_head(model, num_dense: int):
    def call(parts):
        return model(list(parts[: 2 + (1 if num_dense else 0)]), training=False)

    return _tf_head(call, model)


def probe_head(head, spec, source: str) -> None:
    """Call ``head`` on zeros of the contract's shapes; ImportRefused unless it gives one number a row."""
    import tensorflow as tf

    n, f, d, k = 2, len(spec.fields), spec.model.embedding_dim, len(spec.numeric)
    parts = [tf.zeros([n, f, d]), tf.zeros([n, f])] + ([tf.zeros([n, k])] if k else [])
    shapes = f"emb [N, {f}, {d}], first_order [N, {f}]" + (f", dense [N, {k}]" if k else "")
    try:
        out = head.raw(tuple(parts))
    except Exception as e:  # noqa: BLE001 - whatever the head raises: its signature does not match
        raise ImportRefused(f"dense head {source}: does not take {shapes}: {str(e).splitlines()[0]}") from None
    if tuple(out.shape) not in ((n,), (n, 1)):
        raise ImportRefused(
            f"dense head {source}: given {shapes} with N={n} it returned {out.shape}, not one score a row"
        )


def load_head(path: str | Path, spec):
    """The dense head in ``path`` (a SavedModel directory or a Keras file), probed."""
    p = Path(path)
    if p.is_dir():
        head = _saved_model_head(p, len(spec.numeric))
    elif p.suffix in KERAS_SUFFIXES:
        head = _keras_head(_load_keras(p), len(spec.numeric))
    else:
        raise ImportRefused(f"dense head {p}: neither a SavedModel directory nor a {'/'.join(KERAS_SUFFIXES)} file")
    probe_head(head, spec, str(p))
    return head


# -- a whole Keras model -----------------------------------------------------------------------------------
def _embedding_layers(model) -> dict[str, Any]:
    import keras

    return {layer.name: layer for layer in model.layers if isinstance(layer, keras.layers.Embedding)}


def split_keras_model(model, spec, source: str) -> tuple[list[FieldTable], Any]:
    """(tables, head) of a whole Keras model (the module docstring's layer names), the head probed."""
    import keras
    from keras import ops

    d, num_dense = spec.model.embedding_dim, len(spec.numeric)
    layers = _embedding_layers(model)
    tables, emb_layer, fo_layer = [], {}, {}
    for f in spec.fields:
        weights = []
        for suffix, width, into in ((EMB_SUFFIX, d, emb_layer), (FIRST_ORDER_SUFFIX, 1, fo_layer)):
            name = f.name + suffix
            layer = layers.pop(name, None)
            if layer is None:
                raise ImportRefused(f"keras model {source}: field '{f.name}' has no Embedding layer named {name!r}")
            shape = tuple(layer.embeddings.shape)
            # a vocabulary's rows reserved for appended keys (capacity) may be left out: filled at export
            if shape not in ((f.rows, width), (f.rows - f.capacity, width)):
                reserved = f", or ({f.rows - f.capacity}, {width}) without the capacity's rows" if f.capacity else ""
                raise ImportRefused(
                    f"keras model {source}: layer {name!r} is {shape}, field '{f.name}' needs ({f.rows}, {width}) "
                    f"(rows: {f.rows}, embedding_dim: {d}){reserved}"
                )
            into[id(layer)] = spec.field_index(f.name)
            w = ops.convert_to_numpy(layer.embeddings).astype(np.float32)
            weights.append(np.concatenate([w, np.zeros((f.rows - len(w), width), np.float32)]))
        tables.append(FieldTable(weights[0], weights[1][:, 0]))
    if layers:
        raise ImportRefused(f"keras model {source}: Embedding layers {sorted(layers)} match no field of the spec")
    floats = [x for x in model.inputs if "float" in str(x.dtype)]
    if len(floats) != (1 if num_dense else 0) or (num_dense and floats[0].shape[-1] != num_dense):
        got = [(x.name, tuple(x.shape)) for x in floats]
        raise ImportRefused(
            f"keras model {source}: float inputs {got}; the spec's {num_dense} numeric fields need "
            + (f"one [N, {num_dense}] input" if num_dense else "none")
        )
    emb_in = keras.Input((len(spec.fields), d), name="offgraph_emb")
    fo_in = keras.Input((len(spec.fields),), name="offgraph_first_order")
    dense_in = keras.Input((num_dense,), name="offgraph_dense") if num_dense else None
    # the id inputs: placeholders nothing reaches once the embeddings read emb / first_order
    inputs = [
        dense_in if floats and x is floats[0] else keras.Input(batch_shape=x.shape, dtype=x.dtype) for x in model.inputs
    ]
    last = model.outputs[0]._keras_history.operation if len(model.outputs) == 1 else None

    def call(layer, *args, **kwargs):
        ids = args[0] if args else None
        if id(layer) in emb_layer or id(layer) in fo_layer:
            if ids is not None and len(ids.shape) > 1 and (ids.shape[-1] or 0) > 1:
                raise ImportRefused(
                    f"keras model {source}: layer {layer.name!r} takes {tuple(ids.shape)} ids: only one id a row "
                    "is split (a pooled field: give its table and the dense head apart)"
                )
            i = emb_layer.get(id(layer), fo_layer.get(id(layer)))
            part = emb_in[:, i, :] if id(layer) in emb_layer else ops.expand_dims(fo_in[:, i], -1)
            return ops.reshape(part, (-1, *tuple(ids.shape[1:]), part.shape[-1]))
        if layer is last:  # the score's sigmoid: the head returns the logit before it
            if isinstance(layer, keras.layers.Dense) and layer.activation is keras.activations.sigmoid:
                z = ops.matmul(args[0], layer.kernel)
                return z + layer.bias if layer.use_bias else z
            if isinstance(layer, keras.layers.Activation) and layer.activation is keras.activations.sigmoid:
                return args[0]
            if type(layer).__name__ == "Sigmoid":  # keras.ops.sigmoid in a functional graph
                return args[0]
        return layer(*args, **kwargs)

    # Keras' own traversal of the functional graph (what clone_model runs), with the embeddings replaced
    outputs = model._run_through_graph(inputs, call_fn=call)
    head_model = keras.Model([emb_in, fo_in] + ([dense_in] if dense_in is not None else []), outputs)
    head = _keras_head(head_model, num_dense)
    probe_head(head, spec, source)
    return tables, head


# -- sources and the reference -----------------------------------------------------------------------------
def read_sources(spec, *, tables=None, dense=None, keras_model=None) -> tuple[list[FieldTable], Any, dict]:
    """(tables, head, provenance) from ``tables`` (paths) and ``dense`` (a path), or ``keras_model`` (a path)."""
    if keras_model is not None:
        if tables or dense:
            raise ImportRefused("a whole Keras model brings its own tables and head: give --keras alone")
        p = Path(keras_model)
        if p.suffix not in KERAS_SUFFIXES or not p.is_file():
            raise ImportRefused(f"keras model {p}: not a {'/'.join(KERAS_SUFFIXES)} file")
        t, head = split_keras_model(_load_keras(p), spec, str(p))
        return t, head, {"keras_model": {"path": str(p.resolve()), "sha256": file_sha256(p)}}
    if not tables or dense is None:
        raise ImportRefused("give --tables and --dense (or --keras, a whole Keras model)")
    files = table_files(spec, tables)
    t = [field_table(spec, f, _read_arrow(files[f.name]), str(files[f.name])) for f in spec.fields]
    head = load_head(dense, spec)
    dp = Path(dense)
    dense_sum = file_sha256(dp) if dp.is_file() else _tree_sha(dp)
    prov = {
        "tables": {n: {"path": str(p.resolve()), "sha256": file_sha256(p)} for n, p in files.items()},
        "dense": {"path": str(dp.resolve()), "sha256": dense_sum},
    }
    return t, head, prov


def _tree_sha(root: Path) -> str:
    from offgraph.modeldir.manifest import digest

    return digest(tree_checksums(root))


class SourceReference:
    """Scores of the import's sources: FG rows looked up in the source tables (fp32, or through a store
    codec), pooled as the spec says, then the source head; what `offgraph check` compares served scores with."""

    def __init__(self, spec, tables: list[FieldTable], head):
        self.spec, self.tables, self.head = spec, tables, head
        self.metrics: dict = {}  # no training run: no held-out split, no training file

    def proba(self, x: dict, quant: str | None = None, batch: int = 8192) -> np.ndarray:
        """Sigmoid scores (before calibration) of padded inputs ``x`` (``offgraph.model.inputs.encode_table``'s)."""
        import tensorflow as tf

        tables = self.tables if quant in (None, "fp32") else [_through_codec(t, quant) for t in self.tables]
        n = len(x["ids_0"])
        out = []
        for s in range(0, n, batch):
            embs, fos = [], []
            for i, (f, t) in enumerate(zip(self.spec.fields, tables)):
                ids, mask = x[f"ids_{i}"][s : s + batch], x[f"mask_{i}"][s : s + batch]
                count = mask.sum(1, keepdims=True)
                # as offgraph.model.head.masked_pool: a recency field's mask holds its values' weights
                scale = np.ones_like(count) if f.pooling == "sum" else 1.0 / np.maximum(count, 1.0)
                embs.append(np.einsum("nl,nld->nd", mask, t.vectors[ids]) * scale)
                fos.append((mask * t.first_order[ids]).sum(1) * scale[:, 0])
            parts = [tf.constant(np.stack(embs, 1), tf.float32), tf.constant(np.stack(fos, 1), tf.float32)]
            if self.spec.numeric:
                parts.append(tf.constant(x["dense"][s : s + batch], tf.float32))
            out.append(tf.sigmoid(self.head(tuple(parts), training=False)).numpy())
        return np.concatenate(out) if out else np.zeros(0, np.float32)


def _through_codec(t: FieldTable, quant: str) -> FieldTable:
    from offgraph.store.quant import get_codec

    codec = get_codec(quant, t.vectors.shape[1])
    v, w = codec.decode(codec.encode(t.vectors, t.first_order))
    return FieldTable(np.asarray(v, np.float32), np.asarray(w, np.float32).reshape(-1))


def imported_reference(version_dir: str | Path) -> SourceReference:
    """The :class:`SourceReference` of an imported version, from the sources its manifest records (their
    sha256 checked: a source changed since the import is refused)."""
    from offgraph.modeldir.version import ModelVersion

    with ModelVersion.open(version_dir) as v:
        training, spec = v.manifest.training or {}, v.spec
    src = training.get("imported") if isinstance(training, dict) else None
    if not src:
        raise ValueError(f"{version_dir} was not imported (its manifest records no import): check it with --run")
    for part in [src.get("keras_model"), src.get("dense"), *(src.get("tables") or {}).values()]:
        if part is None:
            continue
        p = Path(part["path"])
        now = _tree_sha(p) if p.is_dir() else file_sha256(p) if p.is_file() else None
        if now != part["sha256"]:
            raise ValueError(f"{version_dir}: import source {p} is missing or changed since the import")
    if src.get("keras_model"):
        tables, head, _ = read_sources(spec, keras_model=src["keras_model"]["path"])
    else:
        tables, head, _ = read_sources(
            spec, tables=[t["path"] for t in src["tables"].values()], dense=src["dense"]["path"]
        )
    return SourceReference(spec, tables, head)


def import_model(
    spec_path: str | Path,
    out_dir: str | Path,
    *,
    tables: list[str | Path] | None = None,
    dense: str | Path | None = None,
    keras_model: str | Path | None = None,
    quant: str = "int8",
    shards: int = 8,
    block_cache_mb: int = 64,
    progress: bool = True,
    check_rows=None,
    check_source: str = "<rows>",
):
    """Import into the version directory ``out_dir`` (MODELS/NAME/VERSION); returns (manifest, the check's
    figures or None). ``check_rows``: a pyarrow table of sample rows, scored by the version and by the
    sources (``offgraph.export.check.run_check``): ImportRefused when they differ by more than the
    quantization's bound (the version is left written, for a look)."""
    from offgraph.export.export import CHUNK_ROWS, prepare_version_dir, version_store_config, write_version
    from offgraph.features.spec import load_spec
    from offgraph.model.inputs import needs_stats
    from offgraph.modeldir.manifest import check_version_dir

    out = Path(out_dir)
    check_version_dir(out)
    spec = load_spec(spec_path)
    if needs_stats(spec):
        raise ImportRefused(
            f"spec {spec_path}: a numeric field standardizes without 'stats': an imported model's statistics "
            "must be written in the spec (stats: {mean, std})"
        )
    field_tables, head, provenance = read_sources(spec, tables=tables, dense=dense, keras_model=keras_model)
    training = {
        "imported": {
            "spec": {"path": str(Path(spec_path).resolve()), "sha256": file_sha256(Path(spec_path))},
            **provenance,
        },
        "config": None,
    }
    config = version_store_config(
        out, "rocksdb", dim=spec.model.embedding_dim, quant=quant, shards=shards, block_cache_mb=block_cache_mb
    )
    prepare_version_dir(out)
    manifest = write_version(
        out,
        spec,
        head,
        [t.chunks(CHUNK_ROWS) for t in field_tables],
        config=config,
        training=training,
        progress=progress,
        split=False,
    )
    checked = None
    if check_rows is not None:
        from offgraph.export.check import run_check

        checked = run_check(
            out,
            None,
            check_rows,
            limit=0,
            rows="all",
            source=check_source,
            reference=SourceReference(spec, field_tables, head),
        )
        if checked["max_abs_dp"] > checked["derived_max_diff"]:
            raise ImportRefused(
                f"{out}: served scores differ from the sources' by {checked['max_abs_dp']:.3g} on {checked['rows']} "
                f"rows of {check_source}, over the {checked['quant']} bound {checked['derived_max_diff']:.3g}"
            )
    return manifest, checked
