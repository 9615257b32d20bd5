"""The test tiers. `make test-fast` runs ``pytest -m "not slow"`` (the edit loop: unit tests, no model
training, no subprocesses or servers); `make test` runs everything.

A test is ``slow`` when it is marked ``@pytest.mark.slow``, or when it, one of its fixtures (the whole
fixture closure) or a function they call (two calls deep, through the module globals) uses a fixture of
SLOW_FIXTURES or refers to a name of SLOW_NAMES. The names are read from the compiled code, not the
text, so comments and strings do not count; a new test that trains or starts a process is found
without being marked. Mark by hand what the scan cannot see (work hidden behind a method call, say).
"""

from __future__ import annotations

import inspect
import types

import pytest

# conftest fixtures that train (and export) a model
SLOW_FIXTURES = frozenset({"small_run", "numeric_run", "tiny_model", "requests_"})

# names whose use means training, exporting or another process: a server, an updater, a writer
SLOW_NAMES = frozenset(
    {
        "train_run",
        "export_run",
        "synth_version",  # a model is trained / exported / written
        "subprocess",
        "Popen",
        "executable",
        "StdinWriter",
        "StoreWriter",
        "run_then_kill",  # a child Python
        "multiprocessing",
        "get_context",
        "Process",  # a multiprocessing child
        "uvicorn",  # a server
        "redis_cluster",  # redis-server processes
    }
)

_CALL_DEPTH = 2


def _names(code: types.CodeType) -> set[str]:
    """Global and attribute names used by ``code`` and the functions, lambdas and classes nested in it."""
    out = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _names(const)
    return out


def _uses_slow_names(fn, depth: int, seen: set) -> bool:
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    names = _names(code)
    if names & SLOW_NAMES:
        return True
    if depth == 0:
        return False
    env = getattr(fn, "__globals__", {})
    return any(isinstance(env.get(n), types.FunctionType) and _uses_slow_names(env[n], depth - 1, seen) for n in names)


def is_slow(item: pytest.Item) -> bool:
    if item.get_closest_marker("slow") is not None:
        return True
    fixturenames = set(getattr(item, "fixturenames", ()))
    if fixturenames & SLOW_FIXTURES:
        return True
    funcs = [getattr(item, "function", None)]
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    funcs += [d.func for name in fixturenames for d in defs.get(name, ())]
    seen: set = set()
    return any(f is not None and _uses_slow_names(f, _CALL_DEPTH, seen) for f in funcs)


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if item.get_closest_marker("slow") is None and is_slow(item):
            item.add_marker(pytest.mark.slow)
