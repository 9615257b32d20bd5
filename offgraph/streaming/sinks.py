"""Delta sinks: where a producer (``offgraph stream-train``) puts row deltas; one module per backend,
opened by a string URL whose scheme names the backend (as ``sources.py`` opens sources).

    sink = open_sink("spool:/data/spool")                   # or "kafka://HOST:PORT/TOPIC"
    sink.emit(delta)        # delta: write_delta_file's kwargs (model, model_version, table_ids, ...)
    sink.close()            # everything emitted is delivered (Kafka: flushed), or an OSError says why

``version_dir`` (the exported MODELS/NAME/VERSION the deltas are for, when known): a Kafka
sink records there where the version's deltas begin in the topic (``stream-start.json``),
so that a new replica of that version starts reading there.

Built in: ``spool:DIR`` (``spool.sink``) and ``kafka://HOST:PORT/TOPIC`` (``kafka.sink``), loaded on
use; another backend plugs in with :func:`register_sink`.
"""

from __future__ import annotations

import abc
import importlib
from pathlib import Path


class DeltaSink(abc.ABC):
    scheme = ""  # the URL scheme that opens it (open_sink)
    form = ""  # its URL's form, e.g. "spool:DIR": the text before the first capital is literal

    @classmethod
    def open(cls, url: str, *, version_dir: str | Path | None, partitions: int) -> DeltaSink:
        """The sink that ``url`` (of this backend's ``form``) names: here the class called with the
        location after ``scheme:``; a backend that needs more overrides it."""
        return cls(url.partition(":")[2])  # type: ignore[call-arg]

    @abc.abstractmethod
    def emit(self, delta: dict) -> str:
        """Deliver ``delta``; returns where it went (a path, or a topic and message count)."""

    def close(self) -> None:  # noqa: B027 (optional: most backends hold nothing to release)
        pass

    def describe(self) -> str:
        return type(self).__name__

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


SINKS: dict[str, type[DeltaSink]] = {}

_BUILTIN = {
    "spool": "offgraph.streaming.spool.sink:SpoolSink",
    "kafka": "offgraph.streaming.kafka.sink:KafkaSink",
}  # scheme -> "module:class" of its DeltaSink (imported on use: the backends import this module)


def register_sink(backend: type[DeltaSink]) -> None:
    """Open URLs of ``backend.scheme`` with ``backend``."""
    if not backend.scheme.isidentifier() or not backend.form.startswith(backend.scheme + ":"):
        raise ValueError(f"sink {backend.__name__}: scheme {backend.scheme!r} or form {backend.form!r} is not usable")
    SINKS[backend.scheme] = backend


def _backend(scheme: str) -> type[DeltaSink] | None:
    if scheme not in SINKS and scheme in _BUILTIN:
        module, _, name = _BUILTIN[scheme].partition(":")
        register_sink(getattr(importlib.import_module(module), name))
    return SINKS.get(scheme)


def _of_form(url: str, form: str) -> bool:
    literal = form[: next((i for i, c in enumerate(form) if c.isupper()), len(form))]
    return url.startswith(literal) and len(url) > len(literal)


def _forms() -> str:
    schemes = [*_BUILTIN, *(s for s in SINKS if s not in _BUILTIN)]
    return " or ".join(b.form for s in schemes if (b := _backend(s)) is not None)


def open_sink(target: str, *, version_dir: str | Path | None = None, partitions: int = 4) -> DeltaSink:
    """``spool:DIR`` or ``kafka://HOST:PORT/TOPIC`` (``partitions``: created with this many if the
    topic does not exist) -> a DeltaSink; ValueError naming what is wrong."""
    if not isinstance(target, str):
        raise ValueError(f"delta sink must be a string, got {target!r}")
    scheme, sep, _ = target.partition(":")
    backend = _backend(scheme) if sep else None
    if backend is None or not _of_form(target, backend.form):
        raise ValueError(f"delta sink {target!r}: expected {_forms()}")
    return backend.open(target, version_dir=version_dir, partitions=partitions)


__all__ = ["DeltaSink", "SINKS", "open_sink", "register_sink"]
