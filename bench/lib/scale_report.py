"""The scale bench's report: its acceptance table (``ACCEPTANCE``) and checks, the new / old code comparison,
the Markdown tables of ``scale.md`` and the plots."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.lib.traffic import POPULARITIES

ACCEPTANCE = {  # the acceptance table of bench.scale: what each line checks -> its limit
    "pss_w1_mb": 1000,
    "pss_w2_mb": 1600,
    "pss_small_vs_big": 0.15,
    "ready_s": 15.0,
    "synth_rows_per_s": 1e6,
    # Zipf c1 p99 at the biggest size <= the p99 at 10^7 + this x the predicted read time
    "p99_pred_factor": 2.0,
    "p99_spread": 0.25,  # the repeats' c1 p99 within +-25% of their median
    "uniform_rps_share": 0.8,  # uniform c8 req/s >= this x (device reads/s at depth 8 / misses per request)
    "lfu_gap_points": 3.0,  # row-cache hit ratio at most 3 points below perfect LFU on the same trace
    "swap_p99_ratio": 1.3,
    "swap_steady_s": 20.0,
    "swap_steady_requests": 2000,
    "swap_pss_mb": 1500,
    "swap_bin_p99_ratio": 2.0,  # drawn on the swap's plot (the 1-s bins)
    "regression_ratio": 1.10,  # new / old c1 p50 and p99 at most this, c8 req/s at least its inverse
}


def num(x, fmt: str) -> str:
    return "?" if x is None else format(x, fmt)


def per_bin(sums: dict) -> str:
    return f"{sums['major_faults_per_bin']} / {sums['page_cache_refaults_per_bin']}"


# -- report -------------------------------------------------------------------------------------------------
def _check(value, limit, op: str = "<=") -> dict:
    """One acceptance line: ``value op limit`` (None: not measured, not ok)."""
    ok = value is not None and value == value and (value <= limit if op == "<=" else value >= limit)
    return {"value": value, "limit": limit, "op": op, "ok": bool(ok)}


def _median(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else None


def cells(runs: list[dict], rows: int, workers: int, popularity: str, code: str = "new") -> list[dict]:
    """The runs of one cell (repeats, fresh servers), in the order they ran (older reports: all ``new``)."""
    return [
        r
        for r in runs
        if r["rows"] == rows
        and r["workers"] == workers
        and r["popularity"] == popularity
        and r.get("code", "new") == code
    ]


def regression(runs: list[dict]) -> list[dict]:
    """Per cell measured with the old code too (``--baseline-repo``): the medians of the new and the old
    runs' c1 p50/p99 and c8 throughput, and new / old."""
    out = []
    for rows, w, pop in sorted(
        {(r["rows"], r["workers"], r["popularity"]) for r in runs if r.get("code") == "baseline"}
    ):
        new, old = cells(runs, rows, w, pop), cells(runs, rows, w, pop, "baseline")
        line = {"rows": rows, "workers": w, "popularity": pop, "runs_new": len(new), "runs_old": len(old)}
        for key, get in (
            ("c1_p50_ms", lambda r: r["c1"]["p50_ms"]),
            ("c1_p99_ms", lambda r: r["c1"]["p99_ms"]),
            ("c8_rps", lambda r: r["c8"]["rps"]),
        ):
            n, o = _median(map(get, new)), _median(map(get, old))
            line[key] = {
                "new": n,
                "old": o,
                "new_over_old": n / o if n is not None and o else None,
                # the old runs' own spread: the noise the ratio sits in
                "old_spread": (max(map(get, old)) - min(map(get, old))) / o if len(old) > 1 and o else None,
            }
        out.append(line)
    return out


def acceptance(report: dict) -> dict:
    """The acceptance lines of tables beyond RAM, for the biggest size of the run (10^9 in the default
    sweep) against the 10^7 cell (else the smallest size measured), the swap and the old code."""
    runs = report["runs"]
    new_runs = [r for r in runs if r.get("code", "new") == "new"]
    out: dict = {}
    if not new_runs:
        return out
    sizes = sorted({r["rows"] for r in new_runs})
    big, ref = sizes[-1], 10**7 if 10**7 in sizes else sizes[0]
    for w, key in ((1, "pss_w1_mb"), (2, "pss_w2_mb")):
        rs = [r for r in new_runs if r["rows"] == big and r["workers"] == w]
        if rs:
            worst = max(max(r["pss_after_warmup_mb"], r["pss_under_load_mb"]) for r in rs)
            out[f"pss_workers{w}_at_{big:.0e}_mb"] = _check(worst, ACCEPTANCE[key])
    zipf = cells(runs, big, 1, "zipf")
    if zipf:
        p99 = _median(r["c1"]["p99_ms"] for r in zipf)
        pred = _median((r["c1"].get("prediction") or {}).get("read_ms_c1") for r in zipf)
        ref_p99 = _median(r["c1"]["p99_ms"] for r in cells(runs, ref, 1, "zipf"))
        if big != ref and ref_p99 is not None and pred is not None:
            # c1 p99 <= the p99 at 10^7 + 2 x the predicted read time (medians over the repeats)
            out[f"zipf_c1_p99_w1_at_{big:.0e}_ms"] = _check(p99, ref_p99 + ACCEPTANCE["p99_pred_factor"] * pred)
        if len(zipf) >= 2:
            spread = max(abs(r["c1"]["p99_ms"] - p99) / p99 for r in zipf)
            out[f"zipf_c1_p99_w1_at_{big:.0e}_spread_of_{len(zipf)}_runs"] = _check(spread, ACCEPTANCE["p99_spread"])
    for r in cells(runs, big, 1, "uniform")[:1]:
        bound = r["c8"].get("device_bound_rps")
        # c8 throughput >= 0.8 x (device reads/s at depth 8 / misses per request)
        out[f"uniform_c8_rps_at_{big:.0e}_over_device_bound"] = _check(
            r["c8"]["rps"] / bound if bound else None, ACCEPTANCE["uniform_rps_share"], ">="
        )
    for n in sizes:
        for r in cells(runs, n, 1, "zipf")[:1]:
            if r.get("perfect_lfu_hit_ratio") is not None and r.get("row_cache_hit_ratio") is not None:
                gap = 100 * (r["perfect_lfu_hit_ratio"] - r["row_cache_hit_ratio"])
                out[f"row_cache_hit_points_below_perfect_lfu_at_{n:.0e}"] = _check(gap, ACCEPTANCE["lfu_gap_points"])
    for w in (1, 2):
        a, b = cells(runs, ref, w, "zipf")[:1], cells(runs, big, w, "zipf")[:1]
        if a and b and big != ref:
            rel = abs(b[0]["pss_under_load_mb"] - a[0]["pss_under_load_mb"]) / a[0]["pss_under_load_mb"]
            out[f"pss_under_load_w{w}_{ref:.0e}_vs_{big:.0e}"] = _check(rel, ACCEPTANCE["pss_small_vs_big"])
    out[f"start_to_ready_at_{big:.0e}_s"] = _check(
        max(r["start_to_ready_s"] for r in new_runs if r["rows"] == big), ACCEPTANCE["ready_s"]
    )
    syn = report["synth"].get(str(big))
    if syn and syn.get("rows_per_s"):
        out[f"synth_rows_per_s_at_{big:.0e}"] = _check(syn["rows_per_s"], ACCEPTANCE["synth_rows_per_s"], ">=")
    sw = report.get("swap")
    if sw:
        out["swap_failed_requests"] = _check(sw["failed_requests"], 0)
        if "window_p99_over_steady" in sw:
            out["swap_window_p99_over_steady"] = _check(sw["window_p99_over_steady"], ACCEPTANCE["swap_p99_ratio"])
            out["swap_steady_s"] = _check(sw["steady_s"], ACCEPTANCE["swap_steady_s"], ">=")
            out["swap_steady_requests"] = _check(sw["steady_requests"], ACCEPTANCE["swap_steady_requests"], ">=")
        out["swap_pss_peak_mb"] = _check(sw["pss_peak_mb"], ACCEPTANCE["swap_pss_mb"])
    for line in regression(runs):
        name = f"{line['rows']:.0e}_w{line['workers']}_{line['popularity']}_new_over_old"
        lim = ACCEPTANCE["regression_ratio"]
        out[f"c1_p50_{name}"] = _check(line["c1_p50_ms"]["new_over_old"], lim)
        out[f"c1_p99_{name}"] = _check(line["c1_p99_ms"]["new_over_old"], lim)
        out[f"c8_rps_{name}"] = _check(line["c8_rps"]["new_over_old"], 1 / lim, ">=")
    return out


def _disk(run: dict) -> str:
    """The cell's direct reads at depth 1 before it: p99.9 / max ms (older reports: the cold-read probe)."""
    probe = (run.get("device") or {}).get("qd1") or run.get("disk_probe")
    return "?" if not probe else f"{probe['p999_ms']:.0f} / {probe['max_ms']:.0f}"


def _device_cell(device: dict | None) -> str:
    """Depth 1 and 8: mean / p99 ms, reads/s."""
    if not device:
        return "?"
    return " ; ".join(
        f"{k} {p['mean_ms']:.3f} / {p['p99_ms']:.2f} ms, {p['reads_per_s']:,.0f}/s" for k, p in device.items()
    )


def plan_cell(plan: dict | None) -> str:
    if not plan:
        return "?"
    return f"{num(plan.get('hit_ratio'), '.3f')} / {num(plan.get('read_ms'), '.2f')} ms"


def load_text(run: dict) -> str:
    return "?" if run.get("version_load_s") is None else f"{run['version_load_s']:.1f}"


def warm_text(run: dict) -> str:
    """Warm-up seconds (disk KiB per request in its first and last round), ``?`` in older reports."""
    w = run.get("warmup")
    if not w:
        return "?"
    first, last = w["rounds"][0]["disk_kib_per_request"], w["rounds"][-1]["disk_kib_per_request"]
    return f"{w['seconds']:.0f} s ({first:.0f} -> {last:.0f})"


def from_disk(run: dict) -> str:
    """KiB read from the disk per request at concurrency 1 / 8 (``?`` in older reports)."""
    if "c1_disk_kib_per_request" not in run:
        return "?"
    return f"{run['c1_disk_kib_per_request']:.0f} / {run['c8_disk_kib_per_request']:.0f}"


def fraction(sw: dict, phase: str) -> str:
    """``k of n`` 1-s bins of ``phase`` whose p99 is over twice the steady p99 (``?`` in older reports)."""
    k_n = (sw.get("bins_over_2x_steady") or {}).get(phase)
    return f"{k_n[0]} of {k_n[1]}" if k_n else "?"


def markdown(report: dict) -> str:
    """The figures as Markdown tables (``OUT/scale.md``, pasted into bench/results/)."""
    runs = sorted(
        report["runs"],
        key=lambda r: (
            r["rows"],
            r["workers"],
            r["popularity"] != "zipf",
            r.get("code", "new") != "new",
            r.get("repeat", 0),
        ),
    )
    lines = [
        "| rows | workers | popularity | code, run | ready s (version load s) | warm-up (disk KiB/request: first -> last round) | PSS warm MiB | PSS load MiB | c1 p50 ms | c1 p99 ms | "
        "c8 req/s | c8 p99 ms | row-cache hit | block-cache hit | read from disk KiB/request c1 / c8 | disk B/row | "
        "direct reads qd1 p99.9 / max ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['rows']:.0e} | {r['workers']} | {r['popularity']} | {r.get('code', 'new')} {r.get('repeat', 0)} | "
            f"{r['start_to_ready_s']:.1f} ({load_text(r)}) | {warm_text(r)} | "
            f"{r['pss_after_warmup_mb']:.0f} | {r['pss_under_load_mb']:.0f} | {r['c1']['p50_ms']:.1f} | "
            f"{r['c1']['p99_ms']:.1f} | {r['c8']['rps']:.0f} | {r['c8']['p99_ms']:.0f} | "
            f"{r['row_cache_hit_ratio'] or 0:.3f} | {r['block_cache_hit_ratio'] or 0:.3f} | {from_disk(r)} | "
            f"{r['disk_bytes_per_row']:.1f} | {_disk(r)} |"
        )
    lines += [
        "",
        "Predicted from the disk (the device probe just before each cell, direct 16-KiB random reads; "
        "`offgraph.export.plan.read_time`): read time per request = (row-cache misses per request / reads in "
        "flight) x the device's mean latency at that depth (depths 1 and 8 probed, linear between); reads "
        "in flight = the multi_get chunks the misses make, 1 to the read threads. `offgraph plan`: its "
        "simulated hit ratio and read time for the cell, from the same probe.",
        "",
        "| rows | workers | popularity | code, run | device qd1 ; qd8 (mean / p99 ms, reads/s) | c1 misses/request | "
        "reads in flight (mean latency there) | predicted read ms | measured read ms | c1 p50 / p99 ms | c8 misses/request | "
        "c8 req/s (device bound) | row-cache hit (perfect LFU) | plan: hit / read ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        c1, c8 = r["c1"], r["c8"]
        pr = c1.get("prediction") or {}
        lines.append(
            f"| {r['rows']:.0e} | {r['workers']} | {r['popularity']} | {r.get('code', 'new')} {r.get('repeat', 0)} | "
            f"{_device_cell(r.get('device'))} | {num(c1.get('misses_per_request'), '.1f')} | "
            f"{num(pr.get('reads_in_flight'), '.1f')} ({num(pr.get('latency_at_depth_ms'), '.3f')} ms) | "
            f"{num(pr.get('read_ms_c1'), '.2f')} | {num(c1.get('read_ms_per_request'), '.2f')} | "
            f"{c1['p50_ms']:.1f} / {c1['p99_ms']:.1f} | {num(c8.get('misses_per_request'), '.1f')} | "
            f"{c8['rps']:.0f} ({num(c8.get('device_bound_rps'), '.0f')}) | "
            f"{num(r.get('row_cache_hit_ratio'), '.3f')} ({num(r.get('perfect_lfu_hit_ratio'), '.3f')}) | "
            f"{plan_cell(r.get('plan'))} |"
        )
    reg = regression(report["runs"])
    if reg:
        lines += [
            "",
            "The old code (`--baseline-repo`) beside the new, alternated on fresh servers: medians, "
            "new / old, and the old runs' own spread ((max - min) / median).",
            "",
            "| rows | workers | popularity | runs new / old | c1 p50 ms new / old (x, old spread) | "
            "c1 p99 ms new / old (x, old spread) | c8 req/s new / old (x, old spread) |",
            "|---|---|---|---|---|---|---|",
        ]
        for g in reg:
            lines.append(
                f"| {g['rows']:.0e} | {g['workers']} | {g['popularity']} | {g['runs_new']} / {g['runs_old']} | "
                + " | ".join(
                    f"{num(g[k]['new'], '.1f')} / {num(g[k]['old'], '.1f')} "
                    f"(x{num(g[k]['new_over_old'], '.3f')}, {num(g[k]['old_spread'], '.0%')})"
                    for k in ("c1_p50_ms", "c1_p99_ms", "c8_rps")
                )
                + " |"
            )
    lines += ["", "| rows | synth rows/s (store) | synth rows/s (whole version) | bytes on disk |", "|---|---|---|---|"]
    for n, y in sorted(report["synth"].items(), key=lambda kv: int(kv[0])):
        lines.append(
            f"| {int(n):.0e} | {y.get('store_rows_per_s', y['rows_per_s']) / 1e6:.2f} M | "
            f"{y['rows_per_s'] / 1e6:.2f} M | {y['bytes_on_disk'] / 2**20:,.0f} MiB |"
        )
    sw = report.get("swap")
    if sw:
        lines += [
            "",
            "| swap at | requests | failed | steady p99 ms (requests, s) | p99 from v2 appearing to 15 s "
            "after it serves ms (x steady) | worst 1-s p99 after v2 appears ms | "
            "first 100 on v2 p99 ms | first 100 on v1 again p99 ms | PSS steady / peak MiB | "
            "v2 appears -> serving s | rollback -> v1 serving s | worst steady bin / steady p99 | "
            "bins > 2x steady p99: steady, after v2 appears |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            f"| {sw['rows']:.0e} | {sw['requests']} | {sw['failed_requests']} | {sw['steady_p99_ms']:.0f} "
            f"({sw.get('steady_requests', '?')}, {num(sw.get('steady_s'), '.0f')}) | "
            f"{num(sw.get('window_p99_ms'), '.0f')} (x{num(sw.get('window_p99_over_steady'), '.2f')}) | "
            f"{sw['max_bin_p99_ms_after_v2_appears']:.0f} | {sw['first_100_on_v2_p99_ms']:.0f} | "
            f"{sw['first_100_on_v1_again_p99_ms']:.0f} | {sw['pss_steady_mb']:.0f} / {sw['pss_peak_mb']:.0f} | "
            f"{sw['v2_appears_to_serving_s']:.1f} | {sw['rollback_to_v1_serving_s']:.1f} | "
            f"{sw.get('steady_max_bin_p99_over_steady', float('nan')):.2f} | "
            f"{fraction(sw, 'steady')}, {fraction(sw, 'after_v2_appears')} |",
        ]
    acc = report.get("acceptance") or {}
    if acc:
        lines += ["", "| acceptance: tables beyond RAM | value | limit | ok |", "|---|---|---|---|"]
        lines += [
            f"| {k} | {num(v['value'], '.3g')} | {v.get('op', '<=')} {v['limit']:.4g} | "
            f"{'yes' if v['ok'] else '**no**'} |"
            for k, v in acc.items()
        ]
    return "\n".join(lines) + "\n"


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in report["runs"] if r.get("code", "new") == "new" and not r.get("repeat")]  # one per cell
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for w, color in ((1, "tab:blue"), (2, "tab:orange")):
        for pop, style in (("zipf", "-"), ("uniform", "--")):
            rs = sorted((r for r in runs if r["workers"] == w and r["popularity"] == pop), key=lambda r: r["rows"])
            if rs:
                x = [r["rows"] for r in rs]
                ax.plot(
                    x,
                    [r["pss_under_load_mb"] for r in rs],
                    style,
                    color=color,
                    marker="o",
                    label=f"workers {w}, {pop}, under load",
                )
                ax.plot(
                    x,
                    [r["pss_after_warmup_mb"] for r in rs],
                    style,
                    color=color,
                    marker="x",
                    alpha=0.5,
                    label=f"workers {w}, {pop}, after warm-up",
                )
    for lim in (ACCEPTANCE["pss_w1_mb"], ACCEPTANCE["pss_w2_mb"]):
        ax.axhline(lim, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("total rows")
    ax.set_ylabel("total PSS of the server's processes (MiB)")
    ax.set_title("offgraph serve memory vs model size (int8, D=16, default caches)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scale_memory.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for ax, pop in zip(axes, POPULARITIES):
        for w, color in ((1, "tab:blue"), (2, "tab:orange")):
            rs = sorted((r for r in runs if r["workers"] == w and r["popularity"] == pop), key=lambda r: r["rows"])
            if rs:
                x = [r["rows"] for r in rs]
                ax.plot(x, [r["c1"]["p50_ms"] for r in rs], "-o", color=color, label=f"workers {w} p50 (c=1)")
                ax.plot(x, [r["c1"]["p99_ms"] for r in rs], "--o", color=color, label=f"workers {w} p99 (c=1)")
        ax.set_xscale("log")
        ax.set_xlabel("total rows")
        ax.set_ylabel("latency (ms), N=200")
        ax.set_title(f"{pop} row popularity")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "scale_latency.png", dpi=120)
    plt.close(fig)

    sw = report.get("swap")
    if sw:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        t = [b["t"] for b in sw["bins"]]
        ax.plot(t, [b["p99_ms"] for b in sw["bins"]], "-", color="tab:red", label="p99 per 1-s bin")
        ax.plot(t, [b["p50_ms"] for b in sw["bins"]], "-", color="tab:blue", label="p50 per 1-s bin")
        ax.axhline(sw["steady_p99_ms"] * ACCEPTANCE["swap_bin_p99_ratio"], color="grey", ls=":", label="2x steady p99")
        for name, c in (
            ("v2_appears", "green"),
            ("v2_serving", "green"),
            ("rollback_called", "purple"),
            ("v1_serving", "purple"),
        ):
            ax.axvline(sw["events"][name], color=c, ls="--" if "serving" in name else "-", lw=0.8)
            ax.text(sw["events"][name], ax.get_ylim()[1] * 0.95, name, rotation=90, fontsize=7, va="top")
        ax.set_xlabel("seconds")
        ax.set_ylabel("latency (ms), N=200, concurrency 8")
        ax2 = ax.twinx()
        ax2.plot(
            [p[0] for p in sw["pss_samples"]],
            [p[1] / 2**20 for p in sw["pss_samples"]],
            color="black",
            lw=0.8,
            alpha=0.6,
            label="PSS (MiB)",
        )
        ax2.set_ylabel("total PSS (MiB)")
        ax.set_title(f"swap under load at {sw['rows']:,} rows: {sw['failed_requests']} failed requests")
        ax.legend(loc="upper left", fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "scale_swap.png", dpi=120)
        plt.close(fig)
