"""The write feed (embstore.feed): shared-memory epochs a writer fills and followers read."""
from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from embstore.feed import FeedReader, FeedWriter, combined_from_store_keys, epoch_ids
from embstore.keys import combine_keys, key_array

RB = 16  # test records: two copies of one uint64, so a torn read shows as two different halves


def _batch(rng, n, tables=5, rows=2000):
    t = rng.integers(0, tables, n).astype(np.uint32)
    r = rng.integers(0, rows, n).astype(np.uint64)
    k = combine_keys(t, r)
    _, first = np.unique(k, return_index=True)  # a store write hands the feed unique keys
    return t[first], r[first], k[first]


def _records(values) -> np.ndarray:
    v = np.asarray(values, dtype=np.uint64)
    return np.stack([v, v], axis=1).view(np.uint8).reshape(len(v), RB)


def _values(records) -> np.ndarray:
    return np.ascontiguousarray(records).view(np.uint64).reshape(-1, 2)


def test_reader_sees_the_last_write_of_every_key_across_growth(tmp_path):
    rng = np.random.default_rng(0)
    w = FeedWriter(tmp_path, RB, min_slots=1 << 10)
    r = FeedReader(tmp_path, RB)
    want: dict[int, int] = {}
    counter = 0
    for _ in range(40):
        t, rows, k = _batch(rng, int(rng.integers(1, 3000)))
        vals = np.arange(counter, counter + len(k))
        counter += len(k)
        w.append(key_array(t, rows).tobytes(), _records(vals))
        want.update(zip(k.tolist(), vals.tolist()))
        r.refresh()
        q = np.unique(combine_keys(rng.integers(0, 6, 4000), rng.integers(0, 2500, 4000)))
        pos, recs = r.lookup(q)
        got = dict(zip(q[pos].tolist(), _values(recs)[:, 0].tolist()))
        assert got == {x: want[x] for x in q.tolist() if x in want}
    # the table grew several times; each bigger epoch copied the last, and the reader let go of it
    assert w.cur.slots >= 2 * len(want) and w.cur.count == len(want)
    assert len(r.epochs) == 1 and r.epochs[0].epoch == w.cur.epoch > 3


def test_covered_epochs_and_batch_numbers_across_writer_restarts(tmp_path):
    rng = np.random.default_rng(1)
    w = FeedWriter(tmp_path, RB, epoch_seconds=0.05)
    t, rows, k = _batch(rng, 100)
    assert w.append(key_array(t, rows).tobytes(), _records(np.ones(len(k)))) == 1
    time.sleep(0.06)
    assert w.append(key_array(t, rows).tobytes(), _records(np.full(len(k), 2))) == 2  # a new epoch
    r = FeedReader(tmp_path, RB)
    added, gap = r.refresh()
    assert len(added) == 2 and not gap
    newest, older = r.epochs
    assert (newest.first_batch, older.first_batch, r.begun()) == (2, 1, 2)
    assert r.covered(1) == [] and r.covered(2) == [older]  # batch 2 begun: batch 1 is in the store
    pos, recs = r.lookup(k)
    assert len(pos) == len(k) and (_values(recs) == 2).all()  # the newest epoch wins
    w.close()
    w2 = FeedWriter(tmp_path, RB)  # a restarted writer: a new epoch, batches go on
    assert w2.cur.epoch == newest.epoch + 1 and w2.cur.first_batch == 3
    assert w2.append(key_array(t[:1], rows[:1]).tobytes(), _records([3])) == 3
    added, gap = r.refresh()
    assert len(added) == 1 and not gap and r.covered(3) == r.epochs[1:]


def test_reader_reports_a_gap_when_an_epoch_vanished_unseen(tmp_path):
    w = FeedWriter(tmp_path, RB, epoch_seconds=1e-6, keep_seconds=0.0)
    r = FeedReader(tmp_path, RB)
    added, gap = r.refresh()
    assert len(added) == 1 and not gap
    one = key_array(np.array([1], np.uint32), np.array([5], np.uint64)).tobytes()
    w.append(one, _records([1]))  # new epoch 2 (deleting 1)
    w.append(one, _records([2]))  # new epoch 3 (deleting 2): the reader never saw 2
    added, gap = r.refresh()
    assert len(added) == 1 and gap
    assert epoch_ids(tmp_path / "feed") == [r.epochs[0].epoch]


def test_rows_beyond_2_48_and_wrong_record_sizes_are_refused(tmp_path):
    with pytest.raises(ValueError, match="2\\*\\*48"):
        combined_from_store_keys(key_array(np.array([0], np.uint32), np.array([1 << 50], np.uint64)).tobytes())
    w = FeedWriter(tmp_path, RB)
    with pytest.raises(ValueError, match="records"):
        w.append(key_array(np.array([0], np.uint32), np.array([1], np.uint64)).tobytes(), np.zeros((1, 3), np.uint8))


def _rewrite_forever(path: str, keys: bytes, n: int, seconds: float, ready) -> None:
    w = FeedWriter(path, RB, min_slots=1 << 8)  # small: growth copies happen while the reader reads
    ready.set()
    v, t_end = 1, time.monotonic() + seconds
    while time.monotonic() < t_end:
        w.append(keys, _records(np.full(n, v)))
        v += 1
    w.close()


def test_concurrent_reader_never_sees_a_torn_or_older_row(tmp_path):
    n = 3000
    t = (np.arange(n) % 7).astype(np.uint32)
    rows = np.arange(n, dtype=np.uint64)
    k = combine_keys(t, rows)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_rewrite_forever, args=(str(tmp_path), key_array(t, rows).tobytes(), n, 3.0, ready))
    proc.start()
    try:
        assert ready.wait(60), "writer process did not start"
        r = FeedReader(tmp_path, RB)
        last = np.zeros(n, np.uint64)
        reads = seen = 0
        t_end = time.monotonic() + 2.5
        while time.monotonic() < t_end:
            r.refresh()
            pos, recs = r.lookup(k)
            v = _values(recs)
            assert (v[:, 0] == v[:, 1]).all(), "torn row"
            assert (v[:, 0] >= last[pos]).all(), "a row went back to an older write"
            last[pos] = v[:, 0]
            reads += 1
            seen += len(pos)
        assert reads > 50 and seen > 0 and last.max() > 10
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
