"""The README's quickstart, run top to bottom as a reader would, on outputs laid out as ``make demo`` leaves them
(a smaller model: the session's tiny MovieLens run, exported as version 1 in fp32 with the feature tables and as
version 2 in int8). Its shell blocks are taken from the README itself, so a block that no longer works fails
here; only the port is changed (a free one)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from offgraph.export.export import export_run
from offgraph.testing.harness import free_port

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Quickstart, after `make demo`"


def quickstart_blocks(readme: str) -> list[str]:
    """The ```sh blocks of the quickstart section, in order."""
    start = readme.index(SECTION)
    end = readme.find("\n## ", start + len(SECTION))
    section = readme[start : end if end != -1 else len(readme)]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def test_the_quickstart_has_the_steps_it_promises():
    blocks = quickstart_blocks((REPO / "README.md").read_text())
    text = "\n".join(blocks)
    assert len(blocks) >= 4
    steps = (
        "offgraph serve",
        ":score",
        '"user_id": 196}',
        ":load",
        "/labels/canary",
        "offgraph update",
        "offgraph stream-train",
    )
    for step in steps:
        assert step in text, step


@pytest.fixture(scope="module")
def demo_dir(tiny_model, tmp_path_factory):
    """A working directory holding ``out/demo/{data,models}`` as ``make demo`` writes them, and ``.venv``."""
    models, table = tiny_model
    run = models.parent / "run"
    root = tmp_path_factory.mktemp("quickstart")
    demo = root / "out" / "demo"
    (demo / "data").mkdir(parents=True)
    pq.write_table(table, demo / "data" / "movielens.parquet")
    export_run(run, demo / "models" / "movielens" / "1", shards=2, quant="fp32", progress=False, feature_data=table)
    export_run(run, demo / "models" / "movielens" / "2", shards=2, quant="int8", progress=False)
    (root / ".venv").symlink_to(REPO / ".venv")
    return root


@pytest.mark.timeout(300)
def test_the_readme_quickstart_runs_top_to_bottom(demo_dir):
    port = free_port()
    script = "\n".join(quickstart_blocks((REPO / "README.md").read_text())).replace("8500", str(port))
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "OFFGRAPH_ADMIN_TOKEN")}
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=demo_dir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its background jobs (server, updater) in one group: killed below whatever happens
    )
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    logs = "".join(
        f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in (demo_dir / "out" / "demo").glob("*.log") if p.is_file()
    )
    assert proc.returncode == 0, out[-4000:] + logs
    scores = [json.loads(m) for m in re.findall(r'^\{"model".*\}$', out, flags=re.M)]
    assert len(scores) == 4, out
    full, ids, canary, after = scores
    assert [s["model"] for s in scores] == ["movielens"] * 4
    assert all(len(s["scores"]) == 2 for s in (full, ids, after)) and len(canary["scores"]) == 1
    assert full["version"] == 2 and ids["version"] == 2  # the newest version serves until one is pinned
    assert "serving 1" in out  # the swap to version 1 took
    assert canary["version"] == 1  # the label's version answered, beside the default one
    assert after["version"] == 2 and after["scores"] != ids["scores"], "the streamed rows did not reach the scores"
    assert any((demo_dir / "out" / "demo" / "spool-quickstart" / "applied").iterdir())
