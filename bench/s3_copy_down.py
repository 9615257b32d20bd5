"""Copy-down of a version from object storage: the server's code against one plain parallel download.

A synthetic version (``offgraph synth --out s3://...``, ``--rows``, default 2x10^7) is published to a
SeaweedFS on loopback (``offgraph.testing.seaweedfs``); then, alternated ``--alternations`` times in one
run, each into a fresh folder:

- ``copy_down``: the server's copy (``offgraph.modeldir.remote.copy_down``: manifest, listing, parallel
  ranged reads, every file's xxh3-128 checked against the export's record, manifest last, rename);
- ``obstore``: the same objects listed and fetched with obstore (the chosen library) alone: ranged reads,
  ``--concurrency`` in flight, written in place; nothing checked;
- ``boto3``: the same with boto3's ``download_file`` from a thread pool (the library not chosen).

Throughput is version bytes / wall seconds, medians over the alternations; the acceptance line is
copy_down >= 0.8x obstore. Writes ``OUT/s3_copy_down.{json,md,png}``.

    python -m bench.s3_copy_down --workdir /tmp/s3w --out bench/results/s3-copy-down
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib.report import write_report

BUCKET = "bench"
LIMITS = {"copy_down / obstore throughput": 0.8}


def plain_obstore(endpoint: str, keys: list[tuple[str, int]], dest: Path, concurrency: int, part: int) -> None:
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, client_options={"allow_http": True}, config={"endpoint": endpoint})

    async def run() -> None:
        sem = asyncio.Semaphore(concurrency)
        fds = []

        async def one(key: str, fd: int, start: int, n: int) -> None:
            async with sem:
                data = await obstore.get_range_async(store, key, start=start, length=n)
                os.pwrite(fd, memoryview(data), start)

        jobs = []
        for key, size in keys:
            path = dest / key
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fds.append(fd)
            jobs += [one(key, fd, s, min(part, size - s)) for s in range(0, size, part)]
        await asyncio.gather(*jobs)
        for fd in fds:
            os.close(fd)

    asyncio.run(run())


def plain_boto3(client, keys: list[tuple[str, int]], dest: Path, concurrency: int, part: int) -> None:
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(multipart_chunksize=part, max_concurrency=max(1, concurrency // 4))

    def one(key: str) -> None:
        path = dest / key
        path.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(BUCKET, key, str(path), Config=config)

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, [k for k, _ in keys]))


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(report["mib_s"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, arm in enumerate(arms):
        xs = report["mib_s"][arm]
        ax.scatter([i] * len(xs), xs, alpha=0.6)
        ax.hlines(statistics.median(xs), i - 0.3, i + 0.3)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_ylabel("MiB/s (line: median)")
    ax.set_title(f"copy-down of a {report['version_mib']:.0f} MiB version from SeaweedFS")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="2e7", help="rows of the synthetic version (default %(default)s)")
    ap.add_argument("--alternations", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight (every arm)")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("bench/results/s3-copy-down"))
    args = ap.parse_args()
    from offgraph.modeldir.remote import copy_down, remote_manifest, version_bytes
    from offgraph.objectstore import open_store
    from offgraph.objectstore.transfer import PART_BYTES
    from offgraph.testing.seaweedfs import seaweedfs

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    with seaweedfs(args.workdir / "seaweedfs") as s3:
        s3.create_bucket(BUCKET)
        os.environ.update(s3.env)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "offgraph.cli", "synth", "--out", f"s3://{BUCKET}/m/syn/1", "--rows", args.rows]
            + ["--no-progress"],
            check=True,
            env={**os.environ, "OFFGRAPH_UPLOAD_DIR": str(args.workdir / "uploads")},
        )
        publish_s = time.perf_counter() - t0
        store = open_store(f"s3://{BUCKET}/m")
        _, manifest = remote_manifest(store, "syn", 1)
        total = version_bytes(manifest)
        assert total is not None
        keys = [(o.key, o.size) for o in store.list("m/syn/1/") if not o.key.endswith("manifest.json")]
        client = s3.client()
        arms = {
            "copy_down": lambda d: copy_down(store, "syn", 1, d, concurrency=args.concurrency),
            "obstore": lambda d: plain_obstore(s3.endpoint, keys, d, args.concurrency, PART_BYTES),
            "boto3": lambda d: plain_boto3(client, keys, d, args.concurrency, PART_BYTES),
        }
        seconds: dict[str, list[float]] = {a: [] for a in arms}
        peak_disk = 0
        names = list(arms)
        for i in range(args.alternations):
            # each arm takes each place in turn: the one after another's 500 MiB rmtree meets its writeback
            for arm in names[i % len(names) :] + names[: i % len(names)]:
                fn = arms[arm]
                dest = args.workdir / "dest" / arm
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir(parents=True)
                t = time.perf_counter()
                fn(dest)
                seconds[arm].append(time.perf_counter() - t)
                used = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
                peak_disk = max(peak_disk, used) if arm == "copy_down" else peak_disk
                print(f"alternation {i + 1} {arm}: {total / 2**20 / seconds[arm][-1]:.0f} MiB/s", flush=True)
                shutil.rmtree(dest)
    mib = total / 2**20
    mib_s = {a: [mib / s for s in xs] for a, xs in seconds.items()}
    med = {a: statistics.median(xs) for a, xs in mib_s.items()}
    ratio = med["copy_down"] / med["obstore"]
    # the same alternation's two arms met the same load: their ratio, alternation by alternation
    paired = [c / o for c, o in zip(mib_s["copy_down"], mib_s["obstore"], strict=True)]
    report = {
        "rows": float(args.rows),
        "version_mib": mib,
        "files": len(keys),
        "publish_seconds": publish_s,
        "concurrency": args.concurrency,
        "part_mib": PART_BYTES / 2**20,
        "seconds": seconds,
        "mib_s": mib_s,
        "median_mib_s": med,
        "copy_down_over_obstore": ratio,
        "copy_down_over_obstore_paired": paired,
        "copy_down_over_obstore_paired_median": statistics.median(paired),
        "boto3_over_obstore": med["boto3"] / med["obstore"],
        "cache_disk_bytes_during_copy": peak_disk,
        "cpus": os.cpu_count(),
        "limits": LIMITS,
        "passed": ratio >= LIMITS["copy_down / obstore throughput"],
    }
    md = "\n".join(
        [
            f"# s3_copy_down: {float(args.rows):,.0f} rows, {mib:.0f} MiB in {len(keys)} files, SeaweedFS on loopback",
            "",
            f"published (synth + upload) in {publish_s:.1f} s; {args.alternations} alternations, "
            f"{args.concurrency} requests in flight, {PART_BYTES >> 20} MiB ranges",
            "",
            "| arm | median MiB/s | runs MiB/s |",
            "|---|---|---|",
            *[f"| {a} | {med[a]:.0f} | {', '.join(f'{x:.0f}' for x in mib_s[a])} |" for a in arms],
            "",
            f"copy_down / obstore: x{ratio:.2f} (acceptance >= x{LIMITS['copy_down / obstore throughput']}): "
            f"{'PASS' if report['passed'] else 'FAIL'}; boto3 / obstore x{report['boto3_over_obstore']:.2f}",
            f"copy_down / obstore alternation by alternation: {', '.join(f'x{r:.2f}' for r in paired)} "
            f"(median x{statistics.median(paired):.2f})",
            f"local cache disk during a copy: {peak_disk / 2**20:.0f} MiB (the version; --model-cache-mb must hold "
            "the versions that serve plus this one)",
        ]
    )
    write_report(args.out, "s3_copy_down", report, md, plot)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
