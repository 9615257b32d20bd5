"""Writing the external SST files of a bulk load, in this process or in worker processes.

A *run* is one pass of ascending keys: at most one open SST file per shard, each fed
its keys in sorted order, then finished and ingested. rocksdict's ``SstFileWriter``
holds the GIL while it adds a key (and compresses full blocks), so threads do not
help; with ``workers > 1`` the shards are split over worker processes (shard ``s`` to
worker ``s % workers``) that receive each chunk's packed keys and records through a
Unix socket (the parent keeps encoding the next chunk meanwhile).
"""

from __future__ import annotations

import abc
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np

from offgraph.store.keys import KEY_BYTES

WriterFactory = Callable[[int, str], "SstWriter"]

_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # holds offgraph/


class SstWriter(abc.ABC):
    """One external SST file being written (keys strictly ascending)."""

    @abc.abstractmethod
    def add(self, keys: list[bytes], values: list[bytes]) -> None: ...

    @abc.abstractmethod
    def finish(self) -> None: ...


def _as_bytes_list(buf, width: int) -> list[bytes]:
    """Packed fixed-width items -> list of ``bytes`` (sliced in C, zero bytes kept)."""
    return np.frombuffer(buf, dtype=np.dtype((np.void, width))).tolist()


class LocalWriters:
    """The open SST writers of the shards written in this process."""

    def __init__(self, factory: WriterFactory) -> None:
        self.factory = factory
        self.open: dict[int, SstWriter] = {}

    def add(self, shard: int, path: str, keys, records, width: int) -> None:
        """``keys``, ``records``: packed buffers of 12-byte keys / ``width``-byte records."""
        w = self.open.get(shard)
        if w is None:
            w = self.open[shard] = self.factory(shard, path)
        w.add(_as_bytes_list(keys, KEY_BYTES), _as_bytes_list(records, width))

    def finish(self) -> None:
        for s in sorted(self.open):
            self.open[s].finish()
        self.open = {}

    def close(self) -> None:
        self.open = {}


class _ProcessWriters:
    """Worker processes started as ``python -m offgraph.store.sst_worker`` (not forked: the
    parent has RocksDB threads; not multiprocessing-spawned: that re-imports the
    caller's ``__main__``), each connected through a Unix socket."""

    def __init__(self, factory: WriterFactory, workers: int, start_timeout: float = 120.0) -> None:
        # the socket lives in a private (0700) directory: only this user can connect
        self.sockdir = tempfile.mkdtemp(prefix="offgraph-sst-")
        address = os.path.join(self.sockdir, "s")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        self.conns, self.procs = [], []
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            srv.bind(address)
            srv.listen(workers)
            srv.settimeout(1.0)
            cmd = [sys.executable, "-m", "offgraph.store.sst_worker", address]
            self.procs = [subprocess.Popen(cmd, env=env) for _ in range(workers)]
            deadline = time.monotonic() + start_timeout
            while len(self.conns) < workers:
                try:
                    sock, _ = srv.accept()
                except TimeoutError:
                    dead = [p.returncode for p in self.procs if p.poll() is not None]
                    if dead or time.monotonic() > deadline:
                        raise RuntimeError(f"bulk-load workers did not start (exit codes {dead})") from None
                    continue
                sock.setblocking(True)
                conn = Connection(sock.detach())
                conn.send(factory)
                self.conns.append(conn)
        except BaseException:
            for p in self.procs:
                p.kill()
            self.close()
            raise
        finally:
            srv.close()

    def add(self, shard: int, path: str, keys, records, width: int) -> None:
        conn = self.conns[shard % len(self.conns)]
        try:
            conn.send(("add", shard, path, width))
            conn.send_bytes(keys)
            conn.send_bytes(records)
        except (BrokenPipeError, EOFError, OSError) as e:
            raise RuntimeError(f"bulk-load worker for shard {shard} died: {e}") from e

    def finish(self) -> None:
        for conn in self.conns:
            conn.send(("finish",))
        errors = []
        for i, conn in enumerate(self.conns):
            try:
                status, err = conn.recv()
            except EOFError:
                status, err = "error", "worker process died"
            if status != "ok":
                errors.append(f"worker {i}: {err}")
        if errors:
            raise RuntimeError("bulk-load SST writers failed: " + "; ".join(errors))

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            conn.close()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.conns, self.procs = [], []
        shutil.rmtree(self.sockdir, ignore_errors=True)


class SstRuns:
    """The runs of one bulk load, written in ``tmp`` and ingested with ``ingest``."""

    def __init__(
        self,
        factory: WriterFactory,
        ingest: Callable[[int, list[str]], None],
        tmp: str,
        workers: int = 1,
    ) -> None:
        self.ingest = ingest
        self.tmp = tmp
        self.writers = _ProcessWriters(factory, workers) if workers > 1 else LocalWriters(factory)
        self._new_run()

    def _new_run(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="run-", dir=self.tmp)
        self.paths: dict[int, str] = {}

    def add(self, slices: list[tuple[int, int, int]], keys: np.ndarray, records: np.ndarray) -> None:
        """Add rows sorted by shard: ``slices`` are ``(shard, start, end)`` ranges of
        ``keys`` (``KEY_DTYPE``) and ``records`` (uint8 ``[k, width]``); each shard's keys
        must continue ascending from its previous ones."""
        keys = np.ascontiguousarray(keys).view(np.uint8).reshape(len(keys), KEY_BYTES)
        records = np.ascontiguousarray(records)
        for s, start, end in slices:
            path = self.paths.get(s)
            if path is None:
                path = self.paths[s] = os.path.join(self.dir, f"shard-{s:03d}.sst")
            k, r = keys[start:end].reshape(-1), records[start:end].reshape(-1)
            self.writers.add(s, path, k.data, r.data, records.shape[1])

    def finish_and_ingest(self) -> None:
        """Finish the current run's files, move them into their shards, start a new run."""
        self.writers.finish()
        for s in sorted(self.paths):
            self.ingest(s, [self.paths[s]])
        shutil.rmtree(self.dir, ignore_errors=True)
        self._new_run()

    def close(self) -> None:
        self.writers.close()
        shutil.rmtree(self.dir, ignore_errors=True)
