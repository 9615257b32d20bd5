"""Keys and the shard function of the embedding store (no RocksDB needed)."""

import random
import struct

import numpy as np
import pytest

from offgraph.store.keys import (
    MAX_TABLE_ID,
    META_PREFIX,
    ROW_LIMIT,
    combine_keys,
    decode_keys,
    encode_keys,
    shard_of,
    split_keys,
    splitmix64,
    unique_inverse,
    unique_keys,
)

MASK = (1 << 64) - 1


def ref_splitmix64(x: int) -> int:
    """Reference SplitMix64 (first output for seed x), in Python ints."""
    z = (x + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def test_encode_keys_matches_struct_big_endian():
    rng = random.Random(1)
    pairs = [(0, 0), (0, 1), (1, 0), (MAX_TABLE_ID, MASK), (7, 2**40), (3, 256)]
    pairs += [(rng.randrange(MAX_TABLE_ID + 1), rng.randrange(2**64)) for _ in range(200)]
    t = np.array([p[0] for p in pairs], dtype=np.uint64)
    r = np.array([p[1] for p in pairs], dtype=np.uint64)
    keys = encode_keys(t, r)
    assert keys == [struct.pack(">IQ", a, b) for a, b in pairs]
    assert all(len(k) == 12 for k in keys)  # trailing zero bytes are kept
    dt, dr = decode_keys(keys)
    assert dt.tolist() == [p[0] for p in pairs]
    assert dr.tolist() == [p[1] for p in pairs]


def test_key_bytes_order_is_numeric_order():
    rng = np.random.default_rng(2)
    t = rng.integers(0, 5, 1000)
    r = rng.integers(0, 2**40, 1000)
    keys = encode_keys(t, r)
    by_bytes = sorted(range(1000), key=lambda i: keys[i])
    by_value = sorted(range(1000), key=lambda i: (int(t[i]), int(r[i])))
    assert [keys[i] for i in by_bytes] == [keys[i] for i in by_value]
    assert all(not k.startswith(META_PREFIX) for k in keys)


def test_scalar_table_id_broadcasts():
    assert encode_keys(5, [1, 2]) == [struct.pack(">IQ", 5, 1), struct.pack(">IQ", 5, 2)]


@pytest.mark.parametrize(
    "t, r, msg",
    [
        (0, [-1], "rows must be >= 0"),
        (-2, [1], "table_ids must be >= 0"),
        (0xFFFF, [1], "table id 65535 > 65534"),
        (0xFF000000, [1], "table id 4278190080 > 65534"),
        ([1, 2, 3], [1, 2], "broadcast"),
        (0, [[1, 2]], "1-D"),
        (0, [1.5], "integers"),
    ],
)
def test_bad_keys_raise(t, r, msg):
    with pytest.raises(ValueError, match=msg):
        encode_keys(t, r)


def test_splitmix64_matches_reference():
    assert ref_splitmix64(0) == 0xE220A8397B1DCDAF  # published first output, seed 0
    rng = random.Random(3)
    xs = [0, 1, MASK, 2**63] + [rng.randrange(2**64) for _ in range(500)]
    got = splitmix64(np.array(xs, dtype=np.uint64)).tolist()
    assert got == [ref_splitmix64(x) for x in xs]


def test_shard_of_is_the_documented_function():
    rng = random.Random(4)
    pairs = [(rng.randrange(2**32 - 2**24), rng.randrange(2**64)) for _ in range(500)]
    for shards in (1, 3, 8):
        want = [ref_splitmix64(((a << 40) & MASK) ^ b) % shards for a, b in pairs]
        got = shard_of(
            np.array([p[0] for p in pairs], dtype=np.uint64),
            np.array([p[1] for p in pairs], dtype=np.uint64),
            shards,
        )
        assert got.tolist() == want


@pytest.mark.parametrize("table", [0, 1, 12345])
def test_consecutive_rows_spread_evenly(table):
    n, shards = 100_000, 8
    counts = np.bincount(shard_of(table, np.arange(n), shards), minlength=shards)
    expected = n / shards
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.32, counts  # chi-square critical value, 7 dof, p = 0.001
    assert counts.max() / counts.min() < 1.05, counts


def test_tables_do_not_share_one_shard_pattern():
    # the same rows of two tables must not map to the same shards (else hot rows collide)
    rows = np.arange(10_000)
    same = (shard_of(1, rows, 8) == shard_of(2, rows, 8)).mean()
    assert 0.09 < same < 0.16  # about 1/8 by chance


@pytest.mark.parametrize("shape", ["empty", "one", "all_same", "runs", "random", "descending"])
def test_unique_inverse_is_np_unique(shape):
    rng = np.random.default_rng(7)
    k = {
        "empty": np.zeros(0, np.uint64),
        "one": np.array([5], np.uint64),
        "all_same": np.full(50, 2**63 + 3, np.uint64),
        # a request's keys: per table a block of rows with repeats, tables ascending
        "runs": np.concatenate([combine_keys(np.full(300, t, np.uint32), rng.integers(0, 40, 300)) for t in range(6)]),
        "random": rng.integers(0, 2**64 - 1, 5000, dtype=np.uint64),
        "descending": np.arange(1000, 0, -1).astype(np.uint64).repeat(3),
    }[shape]
    want_u, want_inv = np.unique(k, return_inverse=True)
    u, inv = unique_inverse(k)
    assert u.dtype == k.dtype and np.array_equal(u, want_u)
    assert np.array_equal(inv, want_inv.reshape(-1))
    assert np.array_equal(u[inv], k)


def test_unique_keys_both_paths():
    rng = np.random.default_rng(5)
    for hi in (2**20, 2**63):  # packed-uint64 path and structured fallback
        t = rng.integers(0, 3, 5000).astype(np.uint32)
        r = rng.integers(0, 50, 5000).astype(np.uint64) * np.uint64(hi // 64)
        ut, ur, inv = unique_keys(t, r)
        assert (ut[inv] == t).all() and (ur[inv] == r).all()
        assert len(set(zip(ut.tolist(), ur.tolist()))) == len(ur) == len(set(zip(t.tolist(), r.tolist())))


def test_combined_keys_round_trip_at_the_limits():
    t = np.array([0, 0, 1, 7, MAX_TABLE_ID, MAX_TABLE_ID], np.uint32)
    r = np.array([0, ROW_LIMIT - 1, 5, 123456789, 0, ROW_LIMIT - 1], np.int64)
    k = combine_keys(t, r)
    assert k.dtype == np.uint64 and len(set(k.tolist())) == len(k)
    # the table in the high bits: keys sort as (table, row), and none is the all-ones empty slot
    assert k.tolist() == sorted(k.tolist()) and int(k.max()) < 2**64 - 1
    assert [int(x) for x in k] == [int(a) * ROW_LIMIT + int(b) for a, b in zip(t, r)]
    st, sr = split_keys(k)
    assert st.dtype == np.uint32 and sr.dtype == np.int64
    assert st.tolist() == t.tolist() and sr.tolist() == r.tolist()
    assert combine_keys(3, [1, 2]).tolist() == [3 * ROW_LIMIT + 1, 3 * ROW_LIMIT + 2]  # a scalar table broadcasts


@pytest.mark.parametrize(
    "t, r, msg",
    [
        (MAX_TABLE_ID + 1, [0], "table id 65535 > 65534"),
        (1 << 16, [0], "table id 65536 > 65534"),
        (0, [ROW_LIMIT], "row 281474976710656 >= 2\\*\\*48"),
        (0, [-1], "rows must be >= 0"),
    ],
)
def test_combined_keys_refuse_what_does_not_fit(t, r, msg):
    with pytest.raises(ValueError, match=msg):
        combine_keys(t, r)
