"""deploy/systemd: the units pass `systemd-analyze verify` (where it runs), and the example environment
file sets every variable their command lines use."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_helpers import SYSTEMD
from parts import need

UNITS = ("offgraph-serve.service", "offgraph-update.service")
INSTALLED_OFFGRAPH = "/opt/offgraph/.venv/bin/offgraph"


def _verify(paths: list[Path]) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", *map(str, paths)], capture_output=True, text=True, timeout=60)


def _verifier(tmp_path: Path) -> None:
    """Skip unless systemd-analyze verifies a trivial unit here (absent, or no systemd to ask)."""
    need("systemd-analyze")  # `make test` installs it (tests/parts.py)
    probe = tmp_path / "offgraph-probe.service"
    probe.write_text("[Unit]\nDescription=probe\n[Service]\nExecStart=/bin/true\n")
    out = _verify([probe])
    if out.returncode != 0:
        pytest.skip(f"systemd-analyze verify does not run here: {(out.stdout + out.stderr).strip()[:300]}")


def _as_installed_here(tmp_path: Path, edit=lambda text: text) -> list[Path]:
    """The units with this checkout's `offgraph` in place of the install path (verify checks the binary exists)."""
    here = Path(sys.executable).with_name("offgraph")
    assert here.exists(), here
    out = []
    for name in UNITS:
        text = (SYSTEMD / name).read_text()
        assert INSTALLED_OFFGRAPH in text, name
        (tmp_path / name).write_text(edit(text.replace(INSTALLED_OFFGRAPH, str(here))))
        out.append(tmp_path / name)
    return out


def test_units_pass_systemd_analyze_verify(tmp_path):
    _verifier(tmp_path)
    out = _verify(_as_installed_here(tmp_path))
    # (other units on the machine may have their own warnings: only ours count)
    assert out.returncode == 0 and not [ln for ln in out.stderr.splitlines() if "offgraph" in ln], out.stderr
    # the check can fail: a misspelt directive and a relative command are reported
    broken = _as_installed_here(
        tmp_path,
        lambda t: t.replace("Restart=", "Restrat=").replace(
            f"ExecStart={Path(sys.executable).with_name('offgraph')}", "ExecStart=offgraph"
        ),
    )
    out = _verify(broken)
    assert out.returncode != 0 and "Restrat" in out.stderr, out.stdout + out.stderr


def test_the_example_environment_sets_what_the_units_use():
    env = dict(
        line.split("=", 1)
        for line in (SYSTEMD / "offgraph.env.example").read_text().splitlines()
        if line and not line.startswith("#")
    )
    for name in UNITS:
        text = (SYSTEMD / name).read_text()
        assert "EnvironmentFile=/etc/offgraph/offgraph.env" in text, name
        exec_start = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
        used = set(re.findall(r"\$\{?([A-Z_]+)\}?", exec_start))
        assert used and used <= set(env), (name, sorted(used - set(env)))
    assert "OFFGRAPH_ADMIN_TOKEN" in env  # the server reads it from the environment (never on the command line)
