"""This checkout's package as a wheel, for the tests that install it into a fresh venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def build_wheel(root: Path) -> Path:
    """The wheel of pyproject.toml, README.md and offgraph/ only (nothing else of the repository can come
    along), built under ``root`` (the build writes build/ and *.egg-info into its source tree: a copy's)."""
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "offgraph", src / "offgraph", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = root / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = wheels.glob("offgraph-*.whl")
    return wheel
