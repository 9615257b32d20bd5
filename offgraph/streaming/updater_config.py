"""Settings of the streaming updater (`UpdaterConfig`). Imports nothing heavy (pydantic): `offgraph
update` takes its defaults from here while `offgraph --help` stays free of NumPy and TensorFlow."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from offgraph.config import ConfigModel, option

# offgraph.store.base.DURABILITY, spelled out here because the store loads NumPy (tests check they agree)
DURABILITY = ("flush", "wal")
# what a Kafka source does when a partition's offsets go backwards (offgraph/streaming/README.md, "Offset resets")
OFFSET_RESET = ("stop", "rebase")


class UpdaterConfig(ConfigModel, frozen=True):
    """batch_files: delta files per poll of the source (and so per store write) at most.
    max_batch_rows, max_batch_delay_s: a batch (one store write) is cut once it holds this many rows, or
        once this long was spent gathering it, whichever comes first; it is cut sooner when the source
        holds nothing more, so a lone file is applied at once and a flood in big batches.
    wait_timeout_s: how long a file for a not-yet-complete version may wait before it is dead-lettered.
    poll_interval_s: how long an idle updater waits before polling again; a source that is told of
        new items (the spool, by inotify) ends the wait at once, so this bounds only the fallback.
    version_check_s: how often a newer complete version of the model is looked for.
    sync: fsync every write batch (survives power loss; WAL only).
    durability: "flush": no WAL, memtables flushed to SST after every batch (followers pick up files
        instead of replaying the WAL while holding their GIL); "wal": the write-ahead log.
    max_deltas_per_s: apply at most this many deltas per second (0: unlimited).
    """

    batch_files: int = option(256, ge=1, flag="--batch-files", description="delta files per store write")
    max_batch_rows: int = option(500_000, ge=1, flag="--max-batch-rows", description="rows per store write at most")
    max_batch_delay_s: float = option(
        0.1,
        ge=0,
        flag="--max-batch-delay",
        description="seconds spent gathering one batch at most before it is written; a batch is also written "
        "as soon as no more files wait",
    )
    wait_timeout_s: float = option(
        600.0,
        ge=0,
        flag="--wait-timeout",
        description="seconds a file for a not-yet-complete version may wait before it is dead-lettered",
    )
    poll_interval_s: float = option(
        0.05,
        gt=0,
        flag="--poll-interval",
        description="seconds between polls when idle; with inotify (Linux) a new file is picked up at once and "
        "this only bounds the fallback",
    )
    version_check_s: float = Field(1.0, ge=0)
    sync: bool = option(False, flag="--sync", description="fsync every write batch (survives power loss; WAL only)")
    durability: Literal[DURABILITY] = option(
        "flush",
        flag="--durability",
        description="flush: no WAL, memtables flushed to SST after every batch (followers pick up files instead "
        "of replaying the WAL while holding their GIL); wal: the write-ahead log",
    )
    max_deltas_per_s: float = option(
        0.0,
        ge=0,
        flag="--max-deltas-per-s",
        description="apply at most this many deltas per second (0: unlimited), to leave CPU to serving",
    )
