"""SIGTERM / SIGINT of `offgraph update`: an orderly stop, bounded in time.

Python runs a signal handler in the main thread only, between two bytecodes: a main thread
waiting inside RocksDB (a flush, a close) would not see a signal until that call returns,
which on a full disk can be never. Here the signal is taken by a
thread of its own instead: Python's C-level handler writes the signal's number to a socket
(``signal.set_wakeup_fd``) from whichever thread the kernel interrupts, without the GIL, and
the watchdog thread reading it asks for the orderly stop. If that has not ended the process
within ``grace_s``, it logs one line and ends it with ``os._exit(EXIT_STOP_TIMEOUT)``: an exit
without closing the store is as safe as a kill -9, which loses nothing acknowledged (each
store write is atomic per shard; what was not acknowledged is applied after a restart).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("offgraph.update")

STOP_GRACE_S = 5.0  # how long the orderly stop may take after SIGTERM / SIGINT
EXIT_STOP_TIMEOUT = 3  # the exit status when it took longer (documented in offgraph/streaming/README.md)
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopWatchdog:
    """Install once, from the main thread, before the work starts; :meth:`on_stop` names what
    asks the work to stop (called at once if a signal came before)."""

    def __init__(self, grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self._callbacks: list[Callable[[], None]] = []
        self._signalled: int | None = None
        self._lock = threading.Lock()
        self._r, w = socket.socketpair()
        w.setblocking(False)
        self._w = w  # kept open: the C handler writes to its descriptor
        signal.set_wakeup_fd(w.fileno(), warn_on_full_buffer=False)
        for sig in SIGNALS:  # a Python handler must be set for the wakeup byte to be written
            signal.signal(sig, lambda *_: None)
        threading.Thread(target=self._watch, name="stop-watchdog", daemon=True).start()

    def on_stop(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._callbacks.append(callback)
            signalled = self._signalled is not None
        if signalled:
            callback()

    def _watch(self) -> None:
        while True:
            got = self._r.recv(64)
            sigs = [b for b in got if b in SIGNALS]
            if sigs:
                break
        name = signal.Signals(sigs[0]).name
        with self._lock:
            self._signalled = sigs[0]
            callbacks = list(self._callbacks)
        log.info("%s: stopping (the process exits within %gs either way)", name, self.grace_s)
        for cb in callbacks:
            cb()
        threading.Event().wait(self.grace_s)  # the process normally ends meanwhile (daemon thread)
        log.error(
            "%s: the orderly stop did not finish within %gs: exiting with status %d without closing "
            "the store (as safe as a kill -9: what was not acknowledged is applied after a restart)",
            name,
            self.grace_s,
            EXIT_STOP_TIMEOUT,
        )
        for h in logging.getLogger().handlers:
            h.flush()
        sys.stderr.flush()
        os._exit(EXIT_STOP_TIMEOUT)
