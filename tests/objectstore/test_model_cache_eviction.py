"""The model cache's eviction (``ModelCache._make_room``) and what the server holds from it
(``Registry._held``): versions on local disk, no bucket contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from offgraph.modeldir.manifest import MANIFEST, complete_versions
from offgraph.modeldir.status_file import write_status
from offgraph.server.config import ServerConfig
from offgraph.server.models.registry import ModelRegistry
from offgraph.server.models.remote_cache import ModelCache

MiB = 1 << 20


def _version(model_dir: Path, version: int, mib: int) -> None:
    d = model_dir / str(version)
    d.mkdir(parents=True)
    (d / "blob").write_bytes(b"\0" * (mib * MiB))
    (d / MANIFEST).write_text("{}")


@pytest.fixture
def cache(tmp_path) -> ModelCache:
    c = ModelCache("s3://bucket/models", tmp_path / "cache", bound_bytes=int(10.5 * MiB), first_retry_s=1.0)
    for v in (1, 2, 3):
        _version(tmp_path / "cache" / "ml", v, 3)
    return c


def test_room_is_made_by_evicting_the_oldest_versions_nothing_holds(cache):
    cache._make_room(4 * MiB, lambda name: {1})  # 9 MiB cached + 4 > 10.5: one must go, and 1 is held
    assert complete_versions(cache.dir / "ml") == [1, 3]


def test_eviction_stops_as_soon_as_the_version_fits(cache):
    cache._make_room(1 * MiB, lambda name: set())  # 9 + 1 <= 10.5: nothing goes
    assert complete_versions(cache.dir / "ml") == [1, 2, 3]


def test_held_versions_that_leave_no_room_refuse_the_copy_naming_the_bound(cache):
    with pytest.raises(Exception, match="model-cache-mb"):
        cache._make_room(5 * MiB, lambda name: {1, 2, 3})
    assert complete_versions(cache.dir / "ml") == [1, 2, 3]


def test_the_server_holds_the_version_an_updater_writes(tmp_path):
    models = tmp_path / "cache"
    for v in (1, 2, 3):
        _version(models / "ml", v, 0)
    reg = ModelRegistry(ServerConfig(models_dir=models))
    try:
        assert reg._held("ml") == set()
        write_status(models / "ml", {"version": 2})
        assert reg._held("ml") == {2}
    finally:
        reg.loader.shutdown(wait=False)
