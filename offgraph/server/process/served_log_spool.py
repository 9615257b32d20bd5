"""The served log's spool sink (``--served-log-dir DIR``): each batch an Arrow IPC file
``served-<pid>-<ns>.arrow`` in ``DIR``, written atomically (a reader never sees a partial file; each worker
process writes its own files)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from offgraph.server.process.served_log_base import ServedSink, schema


class SpoolSink(ServedSink):
    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def write(self, table: Any) -> None:
        import pyarrow as pa

        name = f"served-{os.getpid()}-{time.time_ns()}.arrow"
        tmp = self.directory / f".{name}.tmp"
        with pa.OSFile(str(tmp), "wb") as out, pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)
        os.replace(tmp, self.directory / name)

    def describe(self) -> str:
        return str(self.directory)


def read_served(directory: str | Path) -> Any:
    """Every record of the served log in ``directory`` as one Arrow table (files in name order)."""
    import pyarrow as pa

    files = sorted(Path(directory).glob("served-*.arrow"))
    tables = [pa.ipc.open_file(str(f)).read_all() for f in files]
    return pa.concat_tables(tables) if tables else schema().empty_table()
