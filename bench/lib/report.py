"""A bench's outputs: ``OUT/STEM.json`` (every figure), ``OUT/STEM.md`` (the tables, also printed) and ``OUT/STEM.png``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_report(out: Path, stem: str, report: Any, markdown: str, plot: Callable[[Any, Path], None]) -> None:
    """Write the three files of ``report`` under ``out`` and print ``markdown``."""
    (out / f"{stem}.json").write_text(json.dumps(report, indent=1))
    (out / f"{stem}.md").write_text(markdown)
    plot(report, out / f"{stem}.png")
    print(markdown)
