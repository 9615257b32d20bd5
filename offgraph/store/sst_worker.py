"""Worker process of a parallel bulk load: ``python -m offgraph.store.sst_worker ADDRESS``.

Receives a writer factory, then ``("add", shard, path, width)`` + two raw buffers
(packed keys, packed records), ``("finish",)`` (answers ``("ok", None)`` or
``("error", message)``) and ``("stop",)``. See :mod:`offgraph.store.sst_run`.
"""

from __future__ import annotations

import sys
from multiprocessing.connection import Client

from offgraph.store.sst_run import LocalWriters


def serve(conn) -> None:
    writers = LocalWriters(conn.recv())
    error = None
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if error is not None:  # drain until "finish" reports it
            if msg[0] == "add":
                conn.recv_bytes(), conn.recv_bytes()
            elif msg[0] == "finish":
                conn.send(("error", error))
            continue
        try:
            if msg[0] == "add":
                _, shard, path, width = msg
                keys, records = conn.recv_bytes(), conn.recv_bytes()
                writers.add(shard, path, keys, records, width)
            elif msg[0] == "finish":
                writers.finish()
                conn.send(("ok", None))
        except BaseException as e:  # reported to the parent at "finish"
            error = f"{type(e).__name__}: {e}"
            if msg[0] == "finish":
                conn.send(("error", error))
    conn.close()


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: python -m offgraph.store.sst_worker ADDRESS", file=sys.stderr)
        return 2
    with Client(sys.argv[1], family="AF_UNIX") as conn:
        serve(conn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
