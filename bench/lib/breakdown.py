"""The in-process phase breakdown of one request (``bench/serve_breakdown.py``, run as a script in a child
process from the measured checkout's directory) seen from a bench: run it, and its lines of the report."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "serve_breakdown.py"


def layout(repo: Path) -> str:
    return "old" if (repo / "offgraph_cli.py").exists() else "package"


def breakdown_lines(label: str, b: dict) -> list[str]:
    if "error" in b:
        return [f"  {label}: {b['error']}"]
    phases = ", ".join(f"{k} {'-' if v is None else f'{v:.2f}'}" for k, v in b["phases_profiled_ms"].items())
    top = ", ".join(f"{t['function']} {t['ms']:.2f}" for t in b["top_own_time_ms"][:6])
    out = [
        f"  {label}: decode {b['decode_ms']:.2f} ms; score {b['score_unprofiled_median_ms']:.2f} ms median "
        f"({b['score_profiled_ms']:.2f} profiled, over {b['distinct_bodies']} distinct bodies)",
        f"    phases (profiled ms/request): {phases}, other {b['other_profiled_ms']:.2f}",
        f"    most own time (ms/request): {top}",
    ]
    per = b.get("per_request_ms")
    if isinstance(per, dict) and "error" in per:
        out.append(f"    per request, by protocol: {per['error']}")
    elif per:
        for name, ph in per.items():
            out.append(f"    per request, {name} (ms, medians): " + ", ".join(f"{k} {v:.2f}" for k, v in ph.items()))
    return out


def run_breakdown(
    repo: Path,
    model_dir: Path,
    bodies: list[bytes],
    repeats: int,
    row_cache_mb: float,
    intra: int,
    inter: int,
    grpc_messages: dict[str, list[bytes]] | None = None,
) -> dict:
    """``bench/serve_breakdown.py``'s breakdown of the code in ``repo``, in a child process (see its docstring);
    with ``grpc_messages`` (serialized messages of the same candidates, by protocol) each protocol's per-request
    phases too."""
    with tempfile.TemporaryDirectory(prefix="serve-breakdown-") as tmp:
        bodies_path, out = Path(tmp) / "bodies.jsonl", Path(tmp) / "out.json"
        bodies_path.write_bytes(b"\n".join(bodies) + b"\n")
        cmd = [sys.executable, str(SCRIPT), "--model-dir", str(model_dir)]
        if grpc_messages:
            grpc_path = Path(tmp) / "grpc.json"
            encoded = {p: [base64.b64encode(m).decode() for m in ms] for p, ms in grpc_messages.items()}
            grpc_path.write_text(json.dumps(encoded))
            cmd += ["--grpc", str(grpc_path)]
        cmd += ["--bodies", str(bodies_path), "--out", str(out), "--repeats", str(repeats)]
        cmd += [
            "--layout",
            layout(repo),
            "--row-cache-mb",
            str(row_cache_mb),
            "--intra-threads",
            str(intra),
            "--inter-threads",
            str(inter),
        ]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(repo)}
        p = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"breakdown in {repo} failed ({p.returncode}): {p.stderr[-2000:]}")
        return json.loads(out.read_text())
