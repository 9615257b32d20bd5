"""Redis Cluster test helpers: a real cluster (3 masters, 3 replicas, Debian's redis-server) on loopback
for a module's tests, each of which keys its rows by its own namespace."""

import pytest
from parts import need

from offgraph.store import StoreConfig
from offgraph.testing.redis_cluster import redis_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need("redis-server")  # `make test` installs it (tests/parts.py)
    with redis_cluster(tmp_path_factory.mktemp("redis")) as c:
        yield c


def redis_config(cluster, namespace: str, **kw) -> StoreConfig:
    kw.setdefault("dim", 4)
    kw.setdefault("shards", 6)
    return StoreConfig(backend="redis", url=cluster.url, namespace=namespace, **kw)
