"""`pip install .` puts one top-level package, ``offgraph``, into site-packages, plus the ``offgraph``
console script: nothing named ``server``, ``features`` or ``bench`` that would shadow a user's own.
The wheel is built from this checkout and installed without its dependencies into a fresh venv."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_install_is_one_package_and_one_script(tmp_path):
    src = tmp_path / "src"  # a copy: the build writes build/ and *.egg-info into its source tree
    shutil.copytree(
        REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "out", "build", "*.egg-info", "__pycache__")
    )
    wheels = tmp_path / "wheels"
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(src)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = wheels.glob("offgraph-*.whl")
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = env / "bin" / "python"
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    site = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (dist,) = site.glob("offgraph-*.dist-info")
    assert (dist / "top_level.txt").read_text().split() == ["offgraph"]
    installed = [line.split(",")[0] for line in (dist / "RECORD").read_text().splitlines() if line]
    scripts = sorted(Path(p).name for p in installed if p.startswith("../../../bin/"))
    assert scripts == ["offgraph"], scripts
    tops = {Path(p).parts[0] for p in installed if not p.startswith("../../../bin/")}
    assert tops == {"offgraph", dist.name}, sorted(tops)
    # nothing else came along: every Python file is inside the package
    stray = [p for p in installed if p.endswith(".py") and not p.startswith("offgraph/")]
    assert stray == [], stray
    assert "offgraph/testing/harness.py" in installed and not any(p.startswith("offgraph/bench") for p in installed)
