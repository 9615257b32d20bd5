"""offgraph.export.plan (`offgraph plan`): the read-time model on hand-computed numbers, the trace twin against
the trace through FG, and the command line's output and refusals."""

import json
import os
import shutil
import uuid

import numpy as np
import pytest
from page_cache_files import cold_file

import offgraph.cli
from offgraph.export.cache_sim import bench_trace, replay, trace_of
from offgraph.export.plan import Device, read_time, sampled, steady_hit_ratio, synth_trace
from offgraph.store.quant import get_codec
from offgraph.store.row_cache import RowCache

DEV = Device(qd1_ms=0.1, qd8_ms=0.3, qd8_reads_per_s=20000)


def test_device_latency_between_and_past_the_probed_depths():
    assert DEV.latency_ms(1) == pytest.approx(0.1)
    assert DEV.latency_ms(0.5) == pytest.approx(0.1)
    assert DEV.latency_ms(8) == pytest.approx(0.3)
    assert DEV.latency_ms(4.5) == pytest.approx(0.1 + 0.2 * 3.5 / 7)  # 0.2: linear from qd1 to qd8
    assert DEV.latency_ms(16) == pytest.approx(0.8)  # saturated: 16 in flight / 20000 reads/s = 0.8 ms
    with pytest.raises(ValueError, match="qd8_reads_per_s"):
        Device(0.1, 0.3, float("nan"))


def test_read_time_on_hand_computed_numbers():
    # 80 misses over 8 shards, 8 threads: every shard hit (8 (1 - (7/8)^80) = 7.9998), ~8 in flight
    got = read_time(80, DEV, read_threads=8, shards=8, min_chunk_keys=16)
    q = 8 * (1 - (7 / 8) ** 80)
    lat = 0.1 + 0.2 * (q - 1) / 7
    assert got["reads_in_flight"] == pytest.approx(q)
    assert got["read_ms_c1"] == pytest.approx(80 / q * lat)  # ~ 10 rounds of reads at ~0.3 ms: 3.0 ms
    assert got["read_ms_c1"] == pytest.approx(3.0, abs=0.01)
    assert got["c8_bound_req_s"] == pytest.approx(250)  # 20000 reads/s / 80 reads a request

    # one shard, 4 threads: 80 misses cut in chunks of >= 16 keys: 5 chunks, 4 in flight at 0.1 + 0.2 * 3/7
    got = read_time(80, DEV, read_threads=4, shards=1, min_chunk_keys=16)
    assert got["reads_in_flight"] == pytest.approx(4)
    assert got["read_ms_c1"] == pytest.approx(20 * (0.1 + 0.6 / 7))

    # one miss: one read at depth 1
    got = read_time(1, DEV, read_threads=8, shards=8, min_chunk_keys=16)
    assert got["reads_in_flight"] == pytest.approx(1) and got["read_ms_c1"] == pytest.approx(0.1)

    # an index half out of the block cache: 1.5 reads a miss
    got = read_time(80, DEV, read_threads=8, shards=8, reads_per_miss=1.5, min_chunk_keys=16)
    assert got["reads_per_request"] == pytest.approx(120) and got["c8_bound_req_s"] == pytest.approx(20000 / 120)

    got = read_time(0, DEV, read_threads=8, shards=8, min_chunk_keys=16)
    assert got["read_ms_c1"] == 0 and got["c8_bound_req_s"] is None
    with pytest.raises(ValueError, match="misses per request"):
        read_time(float("inf"), DEV, 8, 8)
    with pytest.raises(ValueError, match="read_threads"):
        read_time(10, DEV, 0, 8)


def test_the_trace_twin_gives_the_hit_ratio_of_the_trace_through_fg():
    """``synth_trace`` (columnar; a huge table's row is the rank, not its hash) against ``bench_trace``
    (the bench's bodies through FG): the same cache, sized to evict, sees the same hit ratio."""
    rows, n, codec = 10**6, 300, get_codec("int8", 16)
    fg = bench_trace(rows, "zipf", n_requests=n, n_candidates=100)
    twin = synth_trace(rows, n, 100, "zipf", 1.1)
    assert len(twin.keys) / n == pytest.approx(len(fg.keys) / n, rel=0.03)
    h_fg, h_twin = replay(RowCache(0.5, codec), fg), replay(RowCache(0.5, codec), twin)
    assert 0.3 < h_fg < 0.95  # the cache does evict: the test can tell policies' effects apart
    assert h_twin == pytest.approx(h_fg, abs=0.02)


def test_the_exact_columnar_trace_is_the_servers_very_keys():
    """``request_keys(exact=True)`` (what bench.scale gives perfect LFU) against ``bench_trace`` (the
    same bodies through FG and the server's key path): every request's keys are the same keys."""
    from offgraph.export.plan import request_keys
    from offgraph.export.traffic import draw_columns

    rows, n = 10**7, 40
    fg = bench_trace(rows, "zipf", n_requests=n, n_candidates=50, seed=3)
    req, cand = draw_columns(rows, n, 50, "zipf", 3)
    exact = request_keys(rows, req, cand, n, exact=True)
    for i in range(n):
        np.testing.assert_array_equal(np.sort(exact[i]), np.sort(fg.request(i)))


def _plan(capsys, *args):
    rc = offgraph.cli.main(["plan", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


DISK = ["--disk-ms-qd1", "0.1", "--disk-ms-qd8", "0.3", "--disk-iops-qd8", "20000"]


def test_plan_prints_the_prediction_and_its_inputs(capsys):
    rc, out, _ = _plan(capsys, "--rows", "1e6", "--memory-mb", "64", "--zipf", "1.1", *DISK, "--max-requests", "400")
    assert rc == 0
    for line in (
        "1,000,000 rows",
        "Zipf 1.1",
        "--memory-mb 64",
        "qd1 0.100 ms",
        "20,000 reads/s",
        "hit ratio",
        "misses per request",
        "predicted read time per request (c1)",
        "c8 throughput bound",
    ):
        assert line in out


def test_plan_json_has_the_model_figures_and_no_nan(capsys):
    rc, out, _ = _plan(
        capsys, "--rows", "1e6", "--memory-mb", "64", "--uniform", *DISK, "--max-requests", "400", "--json"
    )
    assert rc == 0

    def no_constants(name):
        raise AssertionError(f"{name} in the plan's JSON")

    plan = json.loads(out, parse_constant=no_constants)
    assert plan["inputs"]["popularity"] == "uniform" and plan["inputs"]["zipf_exponent"] is None
    m = plan["misses_per_request"]
    assert m == pytest.approx((1 - plan["hit"]["hit_ratio"]) * plan["hit"]["keys_per_request"])
    assert plan["c8_bound_req_s"] == pytest.approx(20000 / (m * plan["reads_per_miss"]))
    assert plan["budget"]["memory_mb"] == 64 and plan["row_cache_rows"] > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--rows", "1e6"], "give --probe DIR or --disk-ms-qd1"),
        (["--rows", "1e6", "--disk-ms-qd1", "0.1"], "--disk-ms-qd8, --disk-iops-qd8 missing"),
        (["--rows", "1e6", "--zipf", "0.9", *DISK], "--zipf must be > 1"),
        (["--rows", "1000", *DISK], "at least"),
        (["--rows", "1e6", "--probe", "/nonexistent-dir", *DISK], "not both"),
        (["--rows", "1e6", "--probe", "/nonexistent-dir"], "--probe /nonexistent-dir: not a directory"),
    ],
)
def test_plan_refuses_bad_input_naming_it(capsys, args, message):
    rc, out, err = _plan(capsys, *args)
    assert rc == 2 and out == "" and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--rows", "1e6", "--memory-mb", "-5", *DISK], "--memory-mb"),
        (["--rows", "1e6", "--memory-mb", "nan", *DISK], "--memory-mb"),
        (["--rows", "lots", *DISK], "--rows"),
        (["--rows", "1e6", "--zipf", "1.2", "--uniform", *DISK], "--uniform"),
        (["--rows", "1e6", "--candidates", "0", *DISK], "--candidates"),
    ],
)
def test_plan_argument_errors_name_the_flag(capsys, args, flag):
    with pytest.raises(SystemExit) as e:
        offgraph.cli.main(["plan", *args])
    assert e.value.code == 2 and f"argument {flag}" in capsys.readouterr().err


def test_plan_probes_a_store_on_disk_and_refuses_one_in_memory(tmp_path, capsys):
    (tmp_path / "store" / "shard-0").mkdir(parents=True)
    cold_file(tmp_path / "store" / "shard-0" / "000001.sst", 16)
    rc, out, err = _plan(
        capsys,
        "--rows",
        "1e6",
        "--memory-mb",
        "64",
        "--probe",
        str(tmp_path),
        "--probe-s",
        "0.2",
        "--max-requests",
        "400",
        "--json",
    )
    assert rc == 0, err
    dev = json.loads(out)["inputs"]["device"]
    assert dev["source"] == f"probe of {tmp_path}" and 0 < dev["qd1_ms"] and dev["qd8_reads_per_s"] > 0

    shm = f"/dev/shm/offgraph-plan-{uuid.uuid4().hex}"
    os.makedirs(f"{shm}/shard-0")
    try:
        shutil.copy(tmp_path / "store" / "shard-0" / "000001.sst", f"{shm}/shard-0/000001.sst")
        rc, out, err = _plan(capsys, "--rows", "1e6", "--probe", shm)
    finally:
        shutil.rmtree(shm)
    assert rc == 2 and "tmpfs, held in memory" in err and out == ""


def test_the_miniature_simulation_counts_the_misses_of_the_whole_cache():
    """A 1/8 spatial sample of the keys through a cache of 1/8 the size gives the whole cache's misses
    per request (SHARDS-style miniature simulation), on the same windows of requests."""
    codec = get_codec("int8", 16)

    def trace_fn(n, i):
        return synth_trace(10**7, n, 200, "zipf", 1.1, seed=i)

    kw = dict(max_seconds=100, min_requests=900, window=300, max_requests=900)
    whole = steady_hit_ratio(4, codec, trace_fn, rate=1.0, **kw)
    mini = steady_hit_ratio(4, codec, trace_fn, rate=1 / 8, **kw)
    assert whole["sample_rate"] == 1.0 and mini["sample_rate"] == pytest.approx(1 / 8, rel=0.01)
    assert whole["window_misses_per_request"][0] > 1.5 * whole["misses_per_request"]  # it evicts, and warms
    assert mini["misses_per_request"] == pytest.approx(whole["misses_per_request"], rel=0.05)


def test_a_sample_keeps_or_drops_a_key_in_every_request():
    tr = synth_trace(10**7, 200, 50, "zipf", 1.1)
    s = sampled(tr, 1 / 4)
    kept = set(s.keys.tolist())
    assert 0.15 < len(kept) / len(set(tr.keys.tolist())) < 0.35
    for i in range(tr.requests):
        want = [k for k in tr.request(i).tolist() if k in kept]
        assert s.request(i).tolist() == want


def test_a_trace_that_repeats_reaches_its_steady_state_and_says_so():
    codec = get_codec("int8", 16)
    one = synth_trace(10**6, 1, 200, "zipf", 1.1)

    def same_request(n, i):
        return trace_of([one.request(0)] * n)

    got = steady_hit_ratio(4, codec, same_request, min_requests=40, window=10, max_requests=1000)
    assert got["converged"] and got["misses_per_request"] == 0 and got["hit_ratio"] == 1.0
    assert got["requests_simulated"] < 1000
