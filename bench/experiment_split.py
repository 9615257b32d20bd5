"""An experiment's split at the issue's size, through a real server: ``--users`` users (10,000), each sending
``--requests`` requests (20), half before and half after a restart, over ``--connections`` keep-alive connections
that the kernel spreads over the server's ``--workers`` (2) worker processes; then the prior arm's weight raised
0.1 -> 0.2 and one more request a user.

Weights 0.8 / 0.1 / 0.1 over version 1, the label ``canary`` (on version 1 too: which arm answered is what is
measured) and the prior arm. Checked from the answers (each names its arm): every user in exactly one arm over all
its requests, across workers and the restart; each arm's share of users within ``SHARE_POINTS`` of its weight; the
arm each user gets equals the one computed here from the rule (xxhash64 of salt and key, top 53 bits, over the
arms' ranges in order); after the change, no user of the arms whose weight did not change has moved, and only users
of the first arm moved (to the prior arm). Each worker's CPU time is read from /proc before and after, to show that
both served. Writes ``OUT/experiment_split.json``, ``.md`` and ``.png``.

    python -m bench.experiment_split --out bench/results/experiment-split
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import httpx
import xxhash

from bench.lib.client import Conn
from bench.lib.proc import cpu_seconds
from bench.lib.report import write_report
from bench.lib.server import start
from bench.lib.tiny_model import build_model
from offgraph.testing.harness import free_port

MODEL = "ml"
SALT = "bench-split"
TOKEN = "experiment-split-bench"
ARMS = [{"version": 1, "weight": 0.8}, {"label": "canary", "weight": 0.1}, {"prior": True, "weight": 0.1}]
RAISED = [{"version": 1, "weight": 0.7}, {"label": "canary", "weight": 0.1}, {"prior": True, "weight": 0.2}]
NAMES = ("v1", "canary", "prior")
SHARE_POINTS = 0.015
"""Each arm's share of the users within 1.5 points of its weight (issue 53's acceptance)."""


def rule_arm(user: str, cuts: tuple[float, float]) -> str:
    """The arm the documented rule gives ``user``: xxhash64(salt 0x1f key)'s top 53 bits as a point of [0, 1)."""
    p = (xxhash.xxh64_intdigest(f"{SALT}\x1f{user}".encode()) >> 11) / 2.0**53
    return NAMES[0] if p < cuts[0] else NAMES[1] if p < cuts[1] else NAMES[2]


def worker_pids(pid: int) -> list[int]:
    """The server's child processes: its workers (and a multiprocessing helper, which serves nothing)."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p))
            except OSError:
                continue
    return sorted(out)


async def send(port: int, users: list[str], rounds: int, connections: int) -> tuple[dict[str, set[str]], int]:
    """``rounds`` requests per user (each round every user once, spread over the connections); (arms seen per user,
    requests answered)."""
    conns = [await Conn.open("127.0.0.1", port) for _ in range(connections)]
    seen: dict[str, set[str]] = {u: set() for u in users}
    done = 0
    path = f"/v1/models/{MODEL}:score"

    async def stream(k: int) -> None:
        nonlocal done
        for r in range(rounds):
            # stream k takes every connections-th user, shifted each round: a user's requests go over different
            # connections, so over both workers
            for i in range((k + r) % connections, len(users), connections):
                u = users[i]
                body = json.dumps({"request": {"user_id": u}, "candidates": [{}, {}]}).encode()
                status, payload = await conns[k].post(path, body)
                if status != 200:
                    raise RuntimeError(f"{u}: {status} {payload[:200]!r}")
                seen[u].add(json.loads(payload)["arm"])
                done += 1

    try:
        await asyncio.gather(*(stream(k) for k in range(connections)))
    finally:
        for c in conns:
            c.close()
    return seen, done


def serve(models: Path, port: int, workers: int, log: Path):
    cmd = [sys.executable, "-m", "offgraph.cli", "serve", "--models", str(models), "--port", str(port)]
    cmd += ["--workers", str(workers), "--admin-token", TOKEN, "--log-level", "warning"]
    server = start("split", cmd, port, log)
    server.wait_ready(180)
    return server


def markdown(r: dict) -> str:
    lines = [
        f"Experiment split: {r['users']:,} users x {r['requests_per_user']} requests ({r['requests']:,} in all), "
        f"{r['workers']} workers, a restart halfway, {r['connections']} connections; {r['seconds']:.0f} s.",
        "",
        "| arm | weight | users | share | share - weight |",
        "|---|---|---|---|---|",
    ]
    for name, w in zip(NAMES, (a["weight"] for a in ARMS)):
        s = r["shares"][name]
        lines.append(f"| {name} | {w} | {r['arm_users'][name]:,} | {s:.4f} | {s - w:+.4f} |")
    lines += [
        "",
        f"- users seen in more than one arm: {r['users_in_several_arms']}; users whose arm differs from the rule's: "
        f"{r['users_off_rule']}",
        f"- worker CPU seconds during the requests: {r['worker_cpu_s']}",
        f"- after 0.1 -> 0.2 of the prior arm: moved {r['moved']:,} users ({r['moved_share']:.4f} of all), "
        f"{r['moved_from_unchanged']} of them out of an arm whose weight did not change, "
        f"{r['moved_not_v1_to_prior']} other than v1 -> prior",
        "",
        f"Acceptance: {'PASS' if r['pass'] else 'FAIL'}",
    ]
    return "\n".join(lines) + "\n"


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = range(len(NAMES))
    ax.bar([x - 0.2 for x in xs], [a["weight"] for a in ARMS], 0.4, label="weight")
    ax.bar([x + 0.2 for x in xs], [r["shares"][n] for n in NAMES], 0.4, label="share of users")
    ax.set_xticks(list(xs), NAMES)
    ax.set_ylabel("fraction")
    ax.set_title(f"{r['users']:,} users x {r['requests_per_user']} requests, {r['workers']} workers + restart")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=20, help="requests per user (half before the restart)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--rows", type=int, default=4000, help="ratings to train the built model on")
    args = ap.parse_args(argv)
    if args.requests < 2 or args.requests % 2:
        ap.error("--requests: an even number, at least 2 (half before the restart, half after)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    users = [f"user-{i}" for i in range(args.users)]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="experiment-split-") as tmp:
        models, _ = build_model(Path(tmp), args.rows, MODEL)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        admin = {"Authorization": f"Bearer {TOKEN}"}
        log = out / "server.log"
        server = serve(models, port, args.workers, log)
        try:
            r = httpx.put(f"{url}/v1/models/{MODEL}/labels/canary", json={"version": 1}, headers=admin, timeout=60)
            r.raise_for_status()
            body = {"arms": ARMS, "sticky_key": "user_id", "salt": SALT}
            httpx.put(f"{url}/v1/models/{MODEL}/experiment", json=body, headers=admin, timeout=60).raise_for_status()
            workers = worker_pids(server.pid)
            cpu0 = {w: cpu_seconds(w) for w in workers}
            first, n1 = asyncio.run(send(port, users, args.requests // 2, args.connections))
            cpu = {str(w): round(cpu_seconds(w) - cpu0[w], 1) for w in workers}
        finally:
            server.stop()
        server = serve(models, port, args.workers, log)
        try:
            second, n2 = asyncio.run(send(port, users, args.requests // 2, args.connections))
            body = {"arms": RAISED, "sticky_key": "user_id"}  # the same salt: kept by the server
            httpx.put(f"{url}/v1/models/{MODEL}/experiment", json=body, headers=admin, timeout=60).raise_for_status()
            after, n3 = asyncio.run(send(port, users, 1, args.connections))
        finally:
            server.stop()
        shutil.rmtree(Path(tmp) / "data", ignore_errors=True)
    arms = {u: first[u] | second[u] for u in users}
    several = sum(len(a) != 1 for a in arms.values())
    assigned = {u: next(iter(a)) for u, a in arms.items() if len(a) == 1}
    off_rule = sum(assigned[u] != rule_arm(u, (0.8, 0.9)) for u in assigned)
    arm_users = {n: sum(a == n for a in assigned.values()) for n in NAMES}
    shares = {n: arm_users[n] / len(users) for n in NAMES}
    moved = [(assigned[u], next(iter(after[u]))) for u in assigned if after[u] != {assigned[u]}]
    from_unchanged = sum(a in ("canary", "prior") for a, _ in moved)
    not_v1_to_prior = sum((a, b) != ("v1", "prior") for a, b in moved)
    ok = (
        several == 0
        and off_rule == 0
        and all(abs(shares[n] - a["weight"]) <= SHARE_POINTS for n, a in zip(NAMES, ARMS))
        and from_unchanged == 0
        and not_v1_to_prior == 0
        and sum(c > 0.5 for c in cpu.values()) >= args.workers  # every worker served (the supervisor's other
        # children, a multiprocessing helper, idle)
    )
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "users": len(users),
        "requests_per_user": args.requests,
        "requests": n1 + n2 + n3,
        "workers": args.workers,
        "connections": args.connections,
        "seconds": time.monotonic() - t0,
        "arm_users": arm_users,
        "shares": shares,
        "users_in_several_arms": several,
        "users_off_rule": off_rule,
        "worker_cpu_s": cpu,
        "moved": len(moved),
        "moved_share": len(moved) / len(users),
        "moved_from_unchanged": from_unchanged,
        "moved_not_v1_to_prior": not_v1_to_prior,
        "pass": ok,
    }
    write_report(out, "experiment_split", report, markdown(report), plot)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
