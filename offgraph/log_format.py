"""The log of every offgraph process: one handler on stderr, in text or JSON lines, that uvicorn's
loggers use too, and TensorFlow's and absl's Python loggers kept to errors unless verbose. Imports
nothing heavy."""

from __future__ import annotations

import json
import logging
import os
import sys
import time

FORMATS = ("text", "json")
FORMAT_ENV = "OFFGRAPH_LOG_FORMAT"
"""Set by the command line's ``--log-format``: processes it spawns (server workers) log the same way."""

TEXT = "%(asctime)s %(levelname)s %(name)s%(tag)s: %(message)s"

# their INFO and WARNING lines (renamed SavedModel inputs, "Assets written to") are about TensorFlow's
# internals, not the user's model
QUIET_UNLESS_VERBOSE = ("tensorflow", "absl")

HANDLER_NAME = "offgraph"
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")

_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "tag"}
_RECORD_FIELDS.add("color_message")  # uvicorn's coloured copy of the message


class TextFormatter(logging.Formatter):
    def __init__(self, tag: str = ""):
        super().__init__(TEXT)
        self.tag = tag

    def format(self, record: logging.LogRecord) -> str:
        record.tag = self.tag
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, then the fields a call
    passed in ``extra`` (a request id, say), and the traceback of an exception as ``exc_info``."""

    def __init__(self, tag: str = ""):
        super().__init__()
        self.tag = tag

    def format(self, record: logging.LogRecord) -> str:
        t = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        message = record.getMessage()
        rid = getattr(record, "request_id", None)
        tail = f" [request_id={rid}]"
        if rid is not None and message.endswith(tail):  # the text lines' tag: a field of its own here
            message = message[: -len(tail)]
        out = {
            "time": f"{t}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": message,
        }
        if self.tag:
            out["process"] = self.tag
        for key, value in vars(record).items():  # None: a field that is absent here (no request id)
            if key not in _RECORD_FIELDS and key not in out and value is not None and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc_info"] = record.exc_text
        if record.stack_info:
            out["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def configure_logging(level: int | str, fmt: str | None = None, *, verbose: bool = False, tag: str = "") -> None:
    """The root logger writes ``fmt`` ("text", "json"; None: ``FORMAT_ENV`` or text) to stderr at
    ``level``, unless it has handlers of someone else's; ``tag`` names the process in each line (a
    server worker). uvicorn's loggers lose their own handlers and go through it (give uvicorn
    ``log_config=None``)."""
    fmt = fmt or os.environ.get(FORMAT_ENV) or "text"
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(tag) if fmt == "json" else TextFormatter(f"[{tag}]" if tag else ""))
    handler.set_name(HANDLER_NAME)
    root = logging.getLogger()
    # as logging.basicConfig: a process whose logging is set up already (a host app, pytest) keeps it;
    # a second call replaces the first
    if all(h.get_name() == HANDLER_NAME for h in root.handlers):
        for old in root.handlers[:]:
            root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(level)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    for name in QUIET_UNLESS_VERBOSE:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)
