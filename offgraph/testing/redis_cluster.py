"""A local Redis Cluster for tests, benches and demos: Debian's ``redis-server`` (7.x), masters and one
replica each on loopback, every node its own process in its own directory, stopped by PID.

    with redis_cluster(tmp / "redis", masters=3) as cluster:
        url = cluster.url                       # "redis://127.0.0.1:PORT" (any node seeds a client)
        node = cluster.master_of(b"offgraph:{x}")
        cluster.kill(node)                      # kill -9; its replica takes over (cluster.wait_failover)
        cluster.start(node)                     # back, as a replica of the new master
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

# Cluster timeouts short enough for a test to see a failover in seconds, long enough for a loaded 2-core
# machine not to fail over on its own.
NODE_TIMEOUT_MS = 2000


def _port_pair_free(port: int) -> bool:
    """Whether ``port`` and its cluster bus port (``port + 10000``) are both free on 127.0.0.1."""
    for p in (port, port + 10000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                return False
    return True


def free_node_ports(n: int, start: int = 21000) -> list[int]:
    """``n`` ports whose cluster bus ports are free too (Redis Cluster needs ``port + 10000``)."""
    out: list[int] = []
    port = start + (time.monotonic_ns() // 1000) % 8000  # spread concurrent runs
    while len(out) < n:
        port = start if port >= 30000 else port + 1
        if _port_pair_free(port):
            out.append(port)
    return out


@dataclass
class RedisNode:
    port: int
    dir: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cli(self, *args: str, timeout: float = 10.0) -> str:
        """``redis-cli -p PORT ARGS...``: its output (RuntimeError when it fails)."""
        p = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if p.returncode != 0:
            raise RuntimeError(f"redis-cli -p {self.port} {' '.join(args)}: {p.stderr or p.stdout}")
        return p.stdout


class RedisCluster:
    """``masters`` masters with ``replicas`` replicas each, created empty with ``redis-cli --cluster create``."""

    def __init__(self, root: Path, masters: int = 3, replicas: int = 1, maxmemory_mb: int | None = None) -> None:
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            raise RuntimeError("redis-server and redis-cli are needed (Debian: apt-get install redis-server)")
        self.root, self.masters, self.replicas, self.maxmemory_mb = Path(root), masters, replicas, maxmemory_mb
        self.nodes = [RedisNode(port, self.root / str(port)) for port in free_node_ports(masters * (1 + replicas))]
        self.created = False

    @property
    def url(self) -> str:
        """A URL of the cluster: one live node (a client discovers the others)."""
        live = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        return f"redis://{(live or self.nodes)[0].address}"

    def start(self, node: RedisNode, timeout_s: float = 30.0) -> None:
        """Start one node with its directory's state (its nodes.conf: the cluster it belongs to)."""
        node.dir.mkdir(parents=True, exist_ok=True)
        args = [
            "redis-server",
            "--port",
            str(node.port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
            "--dir",
            str(node.dir),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(NODE_TIMEOUT_MS),
            # a replica may take over however long it was cut off: the fault tests make stale replicas
            # masters on purpose (what a failover that loses acknowledged writes looks like)
            "--cluster-replica-validity-factor",
            "0",
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--logfile",
            str(node.dir / "redis.log"),
        ]
        if self.maxmemory_mb is not None:
            args += ["--maxmemory", f"{self.maxmemory_mb}mb", "--maxmemory-policy", "noeviction"]
        node.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                if node.cli("ping", timeout=2).strip() == "PONG":
                    break
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            if node.proc.poll() is not None or time.monotonic() > t_end:
                log = (node.dir / "redis.log").read_text()[-2000:] if (node.dir / "redis.log").exists() else ""
                self.kill(node)
                raise RuntimeError(f"redis-server on port {node.port} did not start: {log}")
            time.sleep(0.05)
        if self.created and all(n.proc is not None for n in self.nodes):  # a node back in a whole cluster:
            self.wait_ok(timeout_s)  # until it is a replica in sync again (writers WAIT for replicas)
            self.wait_replicated(timeout_s)

    def create(self, timeout_s: float = 60.0) -> None:
        """Start every node and join them into one cluster (slots spread over the masters)."""
        for n in self.nodes:
            self.start(n)
        self.nodes[0].cli(
            "--cluster",
            "create",
            *(n.address for n in self.nodes),
            "--cluster-replicas",
            str(self.replicas),
            "--cluster-yes",
            timeout=timeout_s,
        )
        self.wait_ok(timeout_s)
        self.wait_replicated(timeout_s)
        self.created = True

    def wait_replicated(self, timeout_s: float = 60.0) -> None:
        """Until every live master has its replicas online (a writer's WAIT hears from them: a new cluster's
        replicas first load their master's snapshot)."""
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                infos = [self.info(m, "replication") for m in self.master_nodes()]
                if infos and all(
                    int(i.get("connected_slaves", 0)) >= self.replicas
                    and all("state=online" in v for k, v in i.items() if k.startswith("slave") and k[5:].isdigit())
                    for i in infos
                ):
                    return
            except (RuntimeError, subprocess.TimeoutExpired, ValueError):
                pass
            if time.monotonic() > t_end:
                raise RuntimeError(f"the Redis Cluster under {self.root}: replicas not online after {timeout_s}s")
            time.sleep(0.1)

    def kill(self, node: RedisNode, sig: int = signal.SIGKILL) -> None:
        """Stop one node by PID (``kill -9`` by default)."""
        if node.proc is not None:
            if node.proc.poll() is None:
                node.proc.send_signal(sig)
            node.proc.wait(30)
            node.proc = None

    def stop_all(self) -> None:
        for n in self.nodes:
            self.kill(n)

    def start_all(self, timeout_s: float = 60.0) -> None:
        """Start every stopped node (a whole-cluster restart: each reads back its nodes.conf and AOF)."""
        for n in self.nodes:
            if n.proc is None:
                self.start(n)
        self.wait_ok(timeout_s)

    def live(self) -> list[RedisNode]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def info(self, node: RedisNode, section: str) -> dict[str, str]:
        out = {}
        for line in node.cli("info", section).splitlines():
            k, sep, v = line.partition(":")
            if sep:
                out[k.strip()] = v.strip()
        return out

    def master_nodes(self) -> list[RedisNode]:
        return [n for n in self.live() if self.info(n, "replication").get("role") == "master"]

    def master_of(self, key: bytes | str) -> RedisNode:
        """The live master that holds ``key``'s slot."""
        k = key.decode() if isinstance(key, bytes) else key
        slot = int(self.live()[0].cli("cluster", "keyslot", k).strip())
        for n in self.master_nodes():
            for line in n.cli("cluster", "nodes").splitlines():
                parts = line.split()
                if "myself" in parts[2] and "master" in parts[2]:
                    for rng in parts[8:]:
                        lo, _, hi = rng.partition("-")
                        if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                            return n
        raise RuntimeError(f"no live master holds slot {slot}")

    def node_id(self, node: RedisNode) -> str:
        return node.cli("cluster", "myid").strip()

    def replicas_of(self, master: RedisNode) -> list[RedisNode]:
        """The live nodes that replicate ``master``."""
        mid = self.node_id(master)
        ports = set()
        for line in master.cli("cluster", "nodes").splitlines():
            parts = line.split()
            if len(parts) > 3 and "slave" in parts[2] and parts[3] == mid:
                ports.add(int(parts[1].split("@")[0].rsplit(":", 1)[1]))
        return [n for n in self.live() if n.port in ports]

    def pause(self, node: RedisNode) -> None:
        """SIGSTOP: the node takes no part (a replica stops replicating) until :meth:`resume`."""
        assert node.proc is not None
        node.proc.send_signal(signal.SIGSTOP)

    def cut_replication(self, master: RedisNode) -> None:
        """Close ``master``'s connections to its replicas (a paused replica cannot reconnect): what the
        master acknowledges from now on is on the master alone."""
        master.cli("client", "kill", "type", "replica")

    def resume(self, node: RedisNode) -> None:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGCONT)

    def wait_failover(self, key: bytes | str, old: RedisNode, timeout_s: float = 60.0) -> RedisNode:
        """Until a live node other than ``old`` (killed) serves ``key``'s slot as its master; that node."""
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                now = self.master_of(key)
                if now is not old and now.port != old.port:
                    self.wait_ok(max(1.0, t_end - time.monotonic()))
                    return now
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > t_end:
                raise RuntimeError(f"no replica took over {key!r} from port {old.port} in {timeout_s}s")
            time.sleep(0.1)

    def wait_ok(self, timeout_s: float = 60.0) -> None:
        """Until every live node says ``cluster_state:ok`` and every slot is served."""
        t_end = time.monotonic() + timeout_s
        while True:
            try:
                states = [n.cli("cluster", "info", timeout=2) for n in self.live()]
                if states and all(
                    "cluster_state:ok" in s and "cluster_slots_ok:16384" in s.replace("\r", "") for s in states
                ):
                    return
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            if time.monotonic() > t_end:
                raise RuntimeError(f"the Redis Cluster under {self.root} is not ok after {timeout_s}s")
            time.sleep(0.1)

    def used_memory(self) -> int:
        """Bytes the live masters use (INFO memory's ``used_memory``, summed)."""
        return sum(int(self.info(n, "memory")["used_memory"]) for n in self.master_nodes())


@contextmanager
def redis_cluster(root: Path, masters: int = 3, replicas: int = 1, maxmemory_mb: int | None = None):
    """Yields a fresh, empty, running :class:`RedisCluster`; every node is killed on exit."""
    cluster = RedisCluster(root, masters, replicas, maxmemory_mb)
    try:
        cluster.create()
        yield cluster
    finally:
        cluster.stop_all()
