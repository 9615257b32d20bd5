"""One router a module: ``score``, ``tfserving``, ``models``, ``admin``, ``health``, ``kserve``. A router
imports no other router: what two of them share is in ``offgraph.server.api.deps``."""
