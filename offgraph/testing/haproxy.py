"""HAProxy (Debian's ``haproxy``) in front of several servers on loopback, configured as a rolling update
needs it: round robin, a health check on ``/readyz`` every ``check_ms`` taking a server out at its first
503 (``fall 1``), and the retries a deployment sets for a connection that fails or closes unanswered
(``retries=False``: none at all, so that only the servers' own stop keeps requests from failing).

    with HAProxy([url_a, url_b], Path("haproxy.log")) as lb:     # stopped by PID on exit
        httpx.post(lb.url + "/v1/models/ml:score", ...)
        lb.servers()                                            # {name: {"status": "UP", "2xx": n, ...}}
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from offgraph.testing.harness import free_port

SERVER_NAMES = "s{}"  # the servers' names in the config and the stats, in the order given


def haproxy_config(port: int, stats_port: int, servers: list[str], check_ms: int = 200, retries: bool = True) -> str:
    """The configuration: a frontend on ``127.0.0.1:port``, the ``servers`` (base URLs) behind it, and the
    statistics (CSV at ``/stats;csv``) on ``stats_port``."""
    # a request whose connection fails, or closes without an answer, goes again, to another server
    retry = [
        "    retries 3",
        "    option redispatch 1",
        "    retry-on conn-failure empty-response response-timeout",
        "    option http-buffer-request",  # the whole body is held: a POST can be sent again
    ]
    lines = [
        "global",
        "    log stdout format raw local0 info",
        "    maxconn 512",
        "defaults",
        "    mode http",
        "    log global",
        "    option httplog",
        "    timeout connect 2s",
        "    timeout client 30s",
        "    timeout server 30s",
        "    timeout http-request 10s",
        *(retry if retries else ["    retries 0"]),
        "frontend scoring",
        f"    bind 127.0.0.1:{port}",
        "    default_backend offgraph",
        "frontend stats",
        f"    bind 127.0.0.1:{stats_port}",
        "    stats enable",
        "    stats uri /stats",
        "    stats refresh 1s",
        "backend offgraph",
        "    balance roundrobin",
        "    option httpchk GET /readyz",
        "    http-check expect status 200",
        f"    default-server inter {check_ms}ms fastinter {check_ms}ms downinter {check_ms}ms fall 1 rise 1",
    ]
    for i, url in enumerate(servers):
        u = urlsplit(url)
        lines.append(f"    server {SERVER_NAMES.format(i)} {u.hostname}:{u.port} check")
    return "\n".join(lines) + "\n"


class HAProxy:
    """One ``haproxy`` process (foreground, its log in ``log``) over ``servers`` (base URLs)."""

    def __init__(self, servers: list[str], log: Path, check_ms: int = 200, retries: bool = True):
        binary = shutil.which("haproxy")
        if binary is None:
            raise RuntimeError("haproxy is not installed: apt-get install haproxy (Debian's package)")
        self.binary, self.log = binary, Path(log)
        self.port, self.stats_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.log.with_suffix(".cfg")
        self.config.write_text(haproxy_config(self.port, self.stats_port, servers, check_ms, retries))
        self.names = [SERVER_NAMES.format(i) for i in range(len(servers))]
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20.0) -> HAProxy:
        """Start it and wait until its health checks have found every server UP."""
        check = subprocess.run([self.binary, "-c", "-q", "-f", str(self.config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"haproxy refuses {self.config}: {check.stderr or check.stdout}")
        with open(self.log, "ab") as logf:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [self.binary, "-db", "-f", str(self.config)], stdout=logf, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        last: object = "no answer"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                last = self.servers()
                if all(s["status"] == "UP" for s in last.values()):
                    return self
            except OSError as e:
                last = e
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"haproxy's servers not all UP within {timeout_s:g} s: {last}")

    def servers(self) -> dict[str, dict[str, str | int]]:
        """Each server's state in HAProxy's statistics: ``status`` (UP, DOWN, ...), its requests answered
        ``2xx`` / ``5xx``, its connections ``sessions``."""
        import httpx

        try:
            text = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).text
        except httpx.TransportError as e:
            raise OSError(f"haproxy's statistics: {e}") from None
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {
            r["svname"]: {
                "status": r["status"],
                "2xx": int(r["hrsp_2xx"] or 0),
                "5xx": int(r["hrsp_5xx"] or 0),
                "sessions": int(r["stot"] or 0),
            }
            for r in rows
            if r["pxname"] == "offgraph" and r["svname"] in self.names
        }

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> HAProxy:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
