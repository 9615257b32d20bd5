"""Open one model version as a scorer, verify its store and warm it up before it may serve.

What is verified, at a cost bounded whatever the store's size: with ``ServerConfig.verify``, the
manifest's checksums of dense/ and of the store files recorded at export
(``offgraph.modeldir.manifest.verify_store_files``: sizes, and a sha256 of each file or of its first and
last 64 KiB); RocksDB's own checks when the shards open; then, always, real rows read from every
table in every shard (``EmbeddingStore.verify_sample``: every data block of a small store, a
sample of at most ``VERIFY_MAX_READS`` seeks of a big one; RocksDB checksums each block read).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from offgraph.modeldir.hot_set import read_hot_set
from offgraph.modeldir.manifest import STORE_DIR, load_manifest
from offgraph.scoring.memory_budget import MemorySplit, manifest_index_mb
from offgraph.scoring.scorer import Scorer
from offgraph.server.config import ServerConfig
from offgraph.server.models.pacing import Pacer
from offgraph.server.models.served import ServedVersion
from offgraph.store.prefetch import SERVING_DISK_SHARE, Prefetcher, decide, store_files, store_reads_direct

log = logging.getLogger("offgraph.server")

# candidate counts of the warm-up requests: the first call of a size pays one-off costs
WARMUP_SIZES = (1, 16)

PREFETCH_WAIT_S = 300.0
"""How long a version waits for its store prefetch before it opens anyway (the prefetch goes on)."""

SEED_BATCH = 4096
"""Hot-set rows per read while nothing serves: enough keys for every read thread to have a disk read in flight."""

VERIFY_MAX_READS = 4096
"""Seeks of the row verification per version (a seek reads one data block per SST at that position)."""


def warm_up(scorer, n: int, pace=None) -> None:
    """Score requests built from the spec's raw inputs (no values: zero embeddings) at a few sizes.

    Raises ValueError if the scores are not finite CTRs in [0, 1].
    """
    request = {c: None for c in scorer.spec.raw_inputs("request")}
    item = {c: None for c in scorer.spec.raw_inputs("item")}
    for size in sorted({*WARMUP_SIZES, n}):
        scores = np.asarray(scorer.score(request, [dict(item) for _ in range(size)]))
        if scores.shape != (size,):
            raise ValueError(f"warm-up: {size} candidates gave scores of shape {scores.shape}")
        if not np.all(np.isfinite(scores)) or scores.min() < 0 or scores.max() > 1:
            raise ValueError(f"warm-up: scores are not finite CTRs in [0, 1] (min {scores.min()}, max {scores.max()})")
        if pace is not None:
            pace()


def verify_store(scorer, pace=None) -> None:
    """Read real rows of every table from every shard (``EmbeddingStore.verify_sample``)."""
    tables = scorer.manifest.table_rows()
    t0 = time.perf_counter()
    got = scorer.store.verify_sample(tables, VERIFY_MAX_READS, between=pace)
    log.info(
        "%s: store verified: %d rows read by %d seeks in %.2fs",
        scorer.version_dir,
        got["rows_read"],
        got["seeks"],
        time.perf_counter() - t0,
    )


def seed_hot_set(
    scorer, found: tuple[np.ndarray, np.ndarray] | None, seconds: float, pace=None, serving: bool = False
) -> int:
    """Read the version's static hot set ``found`` (``offgraph.modeldir.hot_set.read_hot_set``), hottest
    first, into its row cache for at most ``seconds``: by the read pool while nothing is served, else on
    this thread with ``pace``'s pauses (``Scorer.warm_rows``). Returns the rows read."""
    if found is None or seconds <= 0 or scorer.row_cache is None:
        return 0
    t0 = time.perf_counter()
    tables, rows = found
    warm = {"tables": tables, "rows": rows, "fields": scorer.table_fields()}
    # a batch's rows race for their sets' slots in one insert: small against the cache, the hotter rows of a
    # set come in before the colder ones (a set's slots then hold its hottest; admission keeps them)
    batch = max(16, min(SEED_BATCH if not serving else 256, scorer.row_cache.capacity_rows // 64))
    n = scorer.warm_rows(warm, batch, pace, until=t0 + seconds, parallel=not serving)
    log.info(
        "%s: row cache seeded with %d of the %d rows of its hot set in %.2fs",
        scorer.version_dir,
        n,
        len(rows),
        time.perf_counter() - t0,
    )
    return n


def start_prefetch(version_dir: Path, config: ServerConfig, serving: bool) -> Prefetcher | None:
    """Read the version's store files into the page cache in the background, if
    ``config.prefetch_store`` says so (``offgraph.store.prefetch``); while the server answers requests
    (``serving``) at most ``config.prefetch_mb_s`` and reading at most ``SERVING_DISK_SHARE`` of the
    time, otherwise as fast as the disk goes. Logs the decision and, from its thread, the result."""
    why = ""

    def report(pf: Prefetcher) -> None:
        if pf.error:
            log.warning("%s: prefetch stopped after %.0f MiB: %s", version_dir, pf.done_bytes / 2**20, pf.error)
        else:
            log.info(
                "%s: prefetched %.0f of %.0f MiB of store files into the page cache in %.1fs, %.1fs of it "
                "reading (%s; I/O class %s)",
                version_dir,
                pf.done_bytes / 2**20,
                pf.total_bytes / 2**20,
                pf.seconds,
                pf.busy_seconds,
                why,
                pf.io_class or "unchanged",
            )

    pf = Prefetcher(
        store_files(version_dir / STORE_DIR),
        config.prefetch_mb_s if serving else 0.0,
        name=f"prefetch-{version_dir.name}",
        on_done=report,
        disk_share=SERVING_DISK_SHARE if serving else 1.0,
    )
    go, why = decide(
        config.prefetch_store,
        pf.total_bytes,
        direct=config.store_io == "direct" and store_reads_direct(version_dir / STORE_DIR),
    )
    if not go:
        log.info("%s: store not prefetched: %s", version_dir, why)
        return None
    return pf.start()


def memory_split(version_dir: Path, config: ServerConfig, models: int, versions: int = 1) -> MemorySplit:
    """This version's share of the process's memory budget (``ServerConfig.memory_split``), its block
    cache sized by the index its manifest's rows need; ``versions``: of its model, served at once."""
    try:
        manifest = load_manifest(version_dir, verify_dense=False)
        index = manifest_index_mb(manifest)
        item_tables = any(t.get("scope") == "item" for t in manifest.feature_tables or ())
    except (KeyError, TypeError, ValueError, AttributeError):  # a bad manifest is refused by the Scorer, with why
        index, item_tables = 0.0, False
    return config.memory_split(models, index, versions, item_tables)


def open_version(
    version_dir: Path,
    config: ServerConfig,
    models: int = 1,
    hot: dict | None = None,
    pacer: Pacer | None = None,
    serving: bool = False,
    versions: int = 1,
) -> ServedVersion:
    """Load, warm up and return one version, given its share of the memory budget with ``models``
    models served and ``versions`` versions of its model (labels: ``memory_split``); raises whatever made it unservable. First its store
    files are read into the page cache when ``config.prefetch_store`` says so (``start_prefetch``,
    waiting at most ``PREFETCH_WAIT_S``). ``hot``: what the serving version used last
    (``Scorer.hot_rows``: its most recently used rows and FG items), read into this version's row
    cache, block cache and FG item cache before it serves, so that its first requests find them
    there. ``pacer``: while any version serves, the load takes only ``pacer.share`` of the time
    (``offgraph.server.models.pacing``). ``serving``: the server answers requests meanwhile, so the prefetch keeps
    to ``config.prefetch_mb_s``; with nothing serving it reads as fast as the disk goes."""
    t0 = time.perf_counter()
    pace = pacer.tick if pacer is not None else None
    split = memory_split(version_dir, config, models, versions)
    log.info(
        "%s: memory budget %.0f MiB over %d model(s)%s: %s",
        version_dir,
        split.memory_mb,
        split.models,
        f", {versions} versions of this one" if versions > 1 else "",
        split.describe(),
    )
    # The files are read in before the store opens: opening, verification seeks and warm-up reads
    # hold the GIL, and a cold read of a virtual disk can take 100s of ms, which every request of
    # a serving version would wait out; and a version serving from a cold store answers its first
    # requests at the disk's pace. The prefetch itself holds no GIL.
    prefetcher = start_prefetch(version_dir, config, serving)
    scorer = None
    try:
        if prefetcher is not None and not prefetcher.wait(PREFETCH_WAIT_S):
            log.warning(
                "%s: opening before its prefetch ended (%.0f of %.0f MiB read in %.0fs)",
                version_dir,
                prefetcher.done_bytes / 2**20,
                prefetcher.total_bytes / 2**20,
                PREFETCH_WAIT_S,
            )
        if pacer is not None:
            pacer.skip()  # waiting for the disk took no CPU: the load's first step owes no pause for it
        scorer = Scorer(
            version_dir,
            store_mode="follow",
            row_cache_mb=split.row_cache_mb,
            block_cache_mb=split.block_cache_mb,
            item_cache_size=split.item_cache_items,
            follow_interval_s=config.follow_interval_s,
            catch_up_s=config.catch_up_s,
            max_request_values=config.max_request_values,
            verify=config.verify,
            store_statistics=True,
            pace=pace,
            direct_reads=config.store_io == "direct",
            # prefetched: the store's blocks are in the page cache, and handing a request's reads to the read
            # pool costs more than the memory copies they are (bench/results/scale-buffered-1e8/)
            parallel_reads=prefetcher is None,
        )
        verify_store(scorer, pace)
        static = read_hot_set(version_dir, scorer.manifest)  # differs from its manifest: a damaged version
        items = scorer.warm_features(hot, pace)  # before warm-up: adopting replaces the FG's item state
        if hot is None:  # before warm-up: its rows (no values) must not hold slots the hot rows need
            seed_hot_set(scorer, static, config.hot_set_seconds, pace, serving)
        warm_up(scorer, config.warmup_candidates, pace)
        if hot is not None:
            t = time.perf_counter()
            n = scorer.warm_rows(hot, pace=pace)
            log.info(
                "%s: warmed with %d hot rows and %d FG items of the serving version in %.2fs%s",
                version_dir,
                n,
                items,
                time.perf_counter() - t,
                f" (paced to {pacer.share:.0%} of the time: {pacer.slept_s:.2f}s of pauses)"
                if pacer is not None and pacer.share < 1
                else "",
            )
    except BaseException:
        if prefetcher is not None:
            prefetcher.stop()
        if scorer is not None:
            scorer.close()
        raise
    return ServedVersion(scorer, time.perf_counter() - t0, split, prefetcher)
