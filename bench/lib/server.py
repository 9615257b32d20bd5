"""The benches' server processes, all started by ``offgraph.testing.harness.ServerProcess`` (as the tests
start theirs): :func:`start` for any server command (``offgraph serve`` of this checkout or of an old one,
the in-graph baseline), and :class:`BenchServer`, one ``offgraph serve`` under measurement: start-to-ready,
PSS, cache counters, admin actions.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from bench.lib.client import Conn
from bench.lib.proc import page_cache_refaults, tree_major_faults, tree_pss_bytes, tree_read_bytes
from offgraph.testing import harness
from offgraph.testing.harness import ServerProcess, free_port, serve_command

REPO = Path(__file__).resolve().parents[2]

ADMIN_TOKEN = "scale-bench"
_LOADED = re.compile(r"serving version \d+ \(loaded and warmed up in ([0-9.]+)s\)")
CACHE_METRICS = {  # what the hit ratios are made of: /metrics counters, summed over the workers
    "row_hits": "offgraph_row_cache_hits_total",
    "row_misses": "offgraph_row_cache_misses_total",
    "block_hits": "offgraph_block_cache_hits_total",
    "block_misses": "offgraph_block_cache_misses_total",
    # the store reads' wall time per request (a histogram; absent from servers that do not record it: 0)
    "read_s_sum": "offgraph_store_read_seconds_sum",
    "read_count": "offgraph_store_read_seconds_count",
}


def start(name: str, cmd: list[str], port: int, log_path: Path, cwd: Path = REPO, pythonpath: Path | None = None):
    """``cmd`` (a server listening on ``port``) in a subprocess, its output in ``log_path``, without the
    environment's admin token. ``cwd``: where ``cmd`` runs; ``python -m offgraph.cli`` imports the code found
    there first (the editable install's finder comes after the path), so another checkout's directory runs its
    code; ``pythonpath`` puts that directory first for the processes the server starts too (its workers)."""
    return ServerProcess(
        cmd, port, log_path, cwd=cwd, pythonpath=pythonpath, env={"OFFGRAPH_ADMIN_TOKEN": None}, name=name
    )


def start_appending(cmd: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """``cmd`` (``offgraph serve``, ``offgraph update``) in this checkout with environment ``env``, its output
    appended to ``log_path``: the process, to :func:`stop` and to pass to ``wait_ready``."""
    return ServerProcess(cmd, 0, log_path, cwd=REPO, env=env, append=True, name=cmd[-1]).proc


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM a process of :func:`start_appending` unless it has exited (killed after 15 s)."""
    harness.stop_process(proc, 15)


def cli_module(code: Path | None) -> str:
    """The module that runs ``offgraph`` in checkout ``code`` (None: this one). A checkout from before the
    one-package layout has ``offgraph_cli.py`` at its top; ``-m offgraph.cli`` started there would import
    this checkout's installed package instead, and so measure the new code under the old one's name."""
    if code is None or (Path(code) / "offgraph" / "cli").is_dir():
        return "offgraph.cli"
    if (Path(code) / "offgraph_cli.py").exists():
        return "offgraph_cli"
    raise SystemExit(f"{code}: neither offgraph/cli/ nor offgraph_cli.py (extract the old code's `git archive`)")


def build_extensions(code: Path) -> None:
    """Build checkout ``code``'s compiled parts in place, as the package's install does (``setup.py``'s
    extensions: the wire-key kernel). A `git archive` of an old revision has the C source but not the built
    module, and its server would then run the pure-Python fallbacks and be measured slower than that code is."""
    code = Path(code)
    setup = code / "setup.py"
    if not setup.exists() or "ext_modules" not in setup.read_text() or any(code.joinpath("offgraph").rglob("*.so")):
        return
    out = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=code, capture_output=True, text=True
    )
    if out.returncode != 0 or not any(code.joinpath("offgraph").rglob("*.so")):
        raise SystemExit(f"{code}: its compiled parts did not build (setup.py build_ext):\n{out.stderr[-2000:]}")


class BenchServer:
    """``offgraph serve --models MODELS --workers W`` with the default cache sizes, on a free port."""

    def __init__(
        self, models: Path, workers: int, log_path: Path, extra: list[str] | None = None, code: Path | None = None
    ):
        """``code``: a checkout whose ``offgraph serve`` runs (the server starts there; default this one)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = serve_command(
            models,
            self.port,
            "--workers",
            str(workers),
            "--admin-token",
            ADMIN_TOKEN,
            *(extra or []),
            module=cli_module(code),
        )
        self.t_start = time.perf_counter()
        self.proc = start(f"serve-w{workers}", cmd, self.port, log_path, cwd=code or REPO)
        self.start_to_ready_s: float | None = None

    def version_load_s(self) -> float | None:
        """The slowest worker's "loaded and warmed up in" figure from the server's log: of start to ready, the
        part that opened, verified and warmed the version (the rest is the interpreter, imports, TensorFlow)."""
        got = _LOADED.findall(Path(self.proc.log_path).read_text(errors="replace"))
        return max(map(float, got)) if got else None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 600, in_a_row: int = 16) -> float:
        """Until ``/readyz`` answers 200 on ``in_a_row`` new connections in a row (each lands on some worker:
        SO_REUSEPORT; every worker's /readyz answers for all of them, this checks it from the outside too).
        Returns (and keeps) the seconds from start to ready."""
        deadline = time.perf_counter() + timeout
        self.proc.wait_ready(timeout)
        ok = 0
        while ok < in_a_row:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{self.url}: not every worker ready within {timeout:g} s")
            ok = ok + 1 if httpx.get(self.url + "/readyz", timeout=10).status_code == 200 else 0
            if not ok:
                time.sleep(0.05)
        self.start_to_ready_s = time.perf_counter() - self.t_start
        return self.start_to_ready_s

    def pss_bytes(self) -> int:
        return tree_pss_bytes(self.pid)

    def fault_counters(self) -> tuple[int, int]:
        """(major page faults of the server's processes, the kernel's page-cache refaults), cumulative."""
        return tree_major_faults(self.pid), page_cache_refaults()

    def disk_read_bytes(self) -> int:
        """Bytes the server's processes read from storage so far (what the page cache did not hold)."""
        return tree_read_bytes(self.pid)

    def counters(self) -> dict[str, float]:
        """The cache counters of /metrics (workers publish theirs every 0.25 s: wait before reading)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out = {}
        for key, name in CACHE_METRICS.items():
            out[key] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
        return out

    def model_status(self, model: str) -> dict:
        """``GET /v1/models/{model}``: the loaded version's store, cache and budget figures."""
        r = httpx.get(f"{self.url}/v1/models/{model}", timeout=10)
        r.raise_for_status()
        return r.json()

    async def admin_async(self, model: str, action: str) -> bytes:
        """An admin action (``:rollback``...) from the caller's event loop on one plain connection, not
        ``httpx`` on a thread: it builds an SSL context per call (tens of ms of CPU in the measuring process, on a thread
        that competes with its event loop), which would be charged to the server's in-flight requests."""
        conn = await Conn.open("127.0.0.1", self.port)
        try:
            status, payload = await conn.post(
                f"/v1/models/{model}:{action}", b"", {"Authorization": f"Bearer {ADMIN_TOKEN}"}
            )
        finally:
            conn.close()
        if status != 200:
            raise RuntimeError(f"{action} of {model}: HTTP {status}: {payload[:300]!r}")
        return payload

    def stop(self) -> None:
        self.proc.stop()


def hit_ratios(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """Row-cache and block-cache hit ratios of the requests between two :meth:`BenchServer.counters`."""
    d = {k: after[k] - before[k] for k in CACHE_METRICS}
    row, block = d["row_hits"] + d["row_misses"], d["block_hits"] + d["block_misses"]
    return {
        "row_cache_hit_ratio": d["row_hits"] / row if row else None,
        "block_cache_hit_ratio": d["block_hits"] / block if block else None,
        "row_cache_lookups": row,
        "block_cache_lookups": block,
    }


def find_key(obj, key: str):
    """The first value named ``key`` anywhere in a JSON document (depth first), or None: where a server
    reports a figure (``capacity_rows``, ``read_threads``) moves between versions of its status."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        obj = list(obj.values())
    if isinstance(obj, list):
        for v in obj:
            got = find_key(v, key)
            if got is not None:
                return got
    return None
