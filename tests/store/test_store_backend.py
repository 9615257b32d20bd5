"""The embedding store's backend interface (``offgraph.store.backend.StoreBackend``): the store HOLDS a
backend (``store.storage``) and is not one, each backend implements all of the interface, a backend that
misses a primitive cannot be made, and the generic store code reaches the storage only through it (no
rocksdict outside the RocksDB backend's modules)."""

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest

from offgraph.store import EmbeddingStore, StoreConfig, open_store
from offgraph.store.backend import StoreBackend
from offgraph.store.open import BACKENDS, backend_class, store_backend
from offgraph.store.prefetch import store_files
from offgraph.store.redis_store import RedisBackend
from offgraph.store.rocksdb_store import RocksDBBackend

STORE_PACKAGE = Path(__file__).resolve().parents[2] / "offgraph" / "store"
ROCKSDB_BACKEND_MODULES = {"rocksdb_store.py", "rocksdb_options.py"}
PRIMITIVES = {
    "_open",
    "_close",
    "_multi_get",
    "_seek_first",
    "_iter_row_keys",
    "_iter_values",
    "_write_batch",
    "_flush",
    "_sst_writer_factory",
    "_ingest",
    "_catch_up",
    "_shard_info",
    "cache_usage",
    "set_cache_mb",
    "block_cache_stats",
    "data_files",
    "reads_direct",
}


def test_the_primitives_are_the_abstract_methods_and_documented():
    assert StoreBackend.__abstractmethods__ == PRIMITIVES
    for name in PRIMITIVES:
        doc = inspect.getdoc(getattr(StoreBackend, name)) or ""
        assert any(f"\n{s}:\n" in doc for s in ("Args", "Returns", "Raises")), f"StoreBackend.{name}: no Args/Returns"
    assert not issubclass(EmbeddingStore, StoreBackend)  # the store holds a backend, it is not one


def test_the_store_holds_its_backend_and_is_made_of_no_mixins():
    assert EmbeddingStore.__mro__ == (EmbeddingStore, object)
    for cls in (RocksDBBackend, RedisBackend):
        assert cls.__mro__[1] is StoreBackend and not issubclass(cls, EmbeddingStore)


@pytest.mark.parametrize("cls", [RocksDBBackend, RedisBackend])
def test_each_backend_implements_every_primitive(cls):
    assert issubclass(cls, StoreBackend)
    assert not cls.__abstractmethods__
    for name in PRIMITIVES:
        assert name in vars(cls), f"{cls.__name__} does not define {name}"
    assert backend_class(cls.backend) is cls


def test_backends_are_chosen_by_name():
    assert BACKENDS == {"rocksdb": RocksDBBackend, "redis": RedisBackend}
    with pytest.raises(ValueError, match="unknown backend 'lmdb'"):
        backend_class("lmdb")


@pytest.mark.parametrize("missing", sorted(PRIMITIVES))
def test_a_backend_missing_a_primitive_cannot_be_instantiated(missing, tmp_path):
    body = {name: getattr(RocksDBBackend, name) for name in PRIMITIVES - {missing}}
    partial = type("PartialBackend", (StoreBackend,), {"backend": "partial", **body})
    with pytest.raises(TypeError, match=rf"abstract method.*\b{missing}\b"):
        EmbeddingStore(str(tmp_path / "s"), StoreConfig(dim=4, quant="fp32", shards=1), "w", partial)
    assert not (tmp_path / "s").exists()  # refused before anything was opened


def test_generic_store_code_imports_no_rocksdict():
    """Every module of offgraph/store but the RocksDB backend's reaches the storage through the ABC."""
    offenders = []
    for path in sorted(STORE_PACKAGE.glob("*.py")):
        if path.name in ROCKSDB_BACKEND_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "rocksdict" or name == "offgraph.store.rocksdb_options":
                    offenders.append(f"{path.name}:{node.lineno} imports {name}")
    assert offenders == []


def test_a_backend_without_external_files_refuses_bulk_load(tmp_path):
    """A backend whose _sst_writer_factory returns None (one that takes no external files): bulk_load
    says so before it reads a chunk, and the store is left as it was."""

    class NoExternalFiles(RocksDBBackend):
        def _sst_writer_factory(self):
            return None

    def chunks():
        raise AssertionError("no chunk may be read")
        yield

    config = StoreConfig(dim=4, quant="fp32", shards=2)
    with EmbeddingStore(str(tmp_path), config, "w", NoExternalFiles) as st:
        st.write(np.zeros(1, np.int64), np.array([3]), np.ones((1, 4), np.float32), np.ones(1, np.float32))
        with pytest.raises(NotImplementedError, match="'rocksdb' store backend does not load external files"):
            st.bulk_load(0, chunks())
        vec, _ = st.read(0, np.array([3]))
        assert vec.tolist() == [[1.0] * 4]
    assert not list(tmp_path.glob(".ingest-*"))


def test_open_store_and_files_go_through_the_named_backend(tmp_path):
    """A store.json names its backend; data_files lists what prefetch reads."""
    path = tmp_path / "s"
    with open_store(path, StoreConfig(dim=4, quant="fp32", shards=2), "w") as st:
        assert type(st) is EmbeddingStore and type(st.storage) is RocksDBBackend
        assert st.backend == st.stats()["backend"] == "rocksdb"
        st.bulk_load(0, [(np.arange(100), np.ones((100, 4), np.float32), np.ones(100, np.float32))])
    assert store_backend(path) is RocksDBBackend
    assert store_backend(tmp_path / "none") is RocksDBBackend  # no store.json: the default backend
    files = store_files(path)
    assert files and sorted(files) == sorted(RocksDBBackend.data_files(path))
    assert all(p.suffix == ".sst" and p.parent.name.startswith("shard-") for p in files)


def test_the_store_delegates_the_backends_public_names(tmp_path):
    """Callers keep using the store: the backend's public methods, and what one backend adds."""
    with open_store(tmp_path / "s", StoreConfig(dim=4, quant="fp32", shards=2), "w") as st:
        assert st.io_mode == st.storage.io_mode
        assert st.cache_usage() == st.storage.cache_usage()
        assert st.block_cache_stats() is None
        assert st.watch_changes(lambda t, r: None, lambda: None) is False
        assert st.property_value(0, "rocksdb.block-cache-capacity") == st.storage.property_value(
            0, "rocksdb.block-cache-capacity"
        )
        with pytest.raises(AttributeError):
            st.no_such_attribute  # noqa: B018
