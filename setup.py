"""The package's one compiled part (pyproject.toml holds everything else): the wire-key kernel of the named-tensor
score path (offgraph/server/api/_wire_keys.c). Optional: where it cannot be built (no C compiler or Python headers),
the install goes on and offgraph.server.api.wire_keys uses its pure-Python twin (tested to agree bit for bit)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("offgraph.server.api._wire_keys", ["offgraph/server/api/_wire_keys.c"], optional=True)])
