"""The row cache in front of a real RocksDB store: it holds the store's records, so what a hit serves is
bit-identical to a store read, in every record format."""

import numpy as np
import pytest

from offgraph.scoring.batch import read_through_cache
from offgraph.store import RowCache, StoreConfig, open_store

D = 16
N = 4000


def read_apart(*args):
    """The rows read, apart: vectors [U, D] (C order) and weights [U], then the counts."""
    got, *counts = read_through_cache(*args)
    return (np.ascontiguousarray(got[:, :-1]), got[:, -1].copy(), *counts)


@pytest.mark.parametrize("quant", ["fp32", "fp16", "int8"])
def test_hits_decode_bit_identical_to_a_store_read(tmp_path, quant):
    rng = np.random.default_rng(5)
    v = rng.standard_normal((N, D)).astype(np.float32)
    w = rng.standard_normal(N).astype(np.float32)
    with open_store(tmp_path / "s", StoreConfig(dim=D, shards=2, quant=quant), mode="w") as st:
        st.write(2, np.arange(N), v, w)
        st.flush()
    with open_store(tmp_path / "s", mode="r") as st:
        cache = RowCache(1, st.codec)
        rows = np.concatenate([rng.permutation(N)[:1500], [N + 5, N + 9]])  # two rows the store lacks
        tables = np.full(len(rows), 2, np.uint32)
        want_v, want_w, found = st.read_unique(tables, rows)
        assert found[:-2].all() and not found[-2:].any()
        # first pass: every row a miss, read from the store and its record cached
        v1, w1, hits, read, n_found = read_apart(cache, st, tables, rows)
        assert (hits, read, n_found) == (0, len(rows), len(rows) - 2)
        # second pass: every row a hit, decoded from the cached record
        v2, w2, hits, read, _ = read_apart(cache, st, tables, rows)
        assert (hits, read) == (len(rows), 0)
        for got_v, got_w in ((v1, w1), (v2, w2)):
            assert got_v.tobytes() == want_v.tobytes() and got_w.tobytes() == want_w.tobytes()
        # what the arena holds is exactly the store's records
        hit, recs, _ = cache.lookup_records(tables[:-2], rows[:-2])
        store_recs, _ = st.read_unique_records(tables[:-2], rows[:-2])
        assert hit.all() and np.array_equal(recs, store_recs)
        # a mixed request (some hits, some misses) too
        more = np.concatenate([rows[:100], np.setdiff1d(np.arange(N), rows)[:100]])
        v3, w3, hits, read, _ = read_apart(cache, st, np.full(200, 2, np.uint32), more)
        mv, mw, _ = st.read_unique(np.full(200, 2, np.uint32), more)
        assert (hits, read) == (100, 100) and v3.tobytes() == mv.tobytes() and w3.tobytes() == mw.tobytes()


def test_int8_holds_more_rows_per_mib_than_decoded_floats(tmp_path):
    """The arena holds 21-byte int8 records (D=16), not 68 bytes of float32 vector and weight: more than
    twice the rows the decoded cache held in the same MiB (86 bytes a row)."""
    with open_store(tmp_path / "s", StoreConfig(dim=D, shards=1, quant="int8"), mode="w") as st:
        cache = RowCache(64, st.codec)
    decoded_rows = 64 * (1 << 20) / (8 + 4 * D + 4 + 8 + 8 / 4)
    assert cache.capacity_rows > 2 * decoded_rows
    assert cache.stats()["bytes"] <= 64 * (1 << 20)
