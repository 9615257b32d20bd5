"""Which of the app's routes a request's path matches: for the error counters' route label and for the
``Allow`` header of a 405 (Starlette names only the first route whose path matches, and two routes may
share a path with different methods: a label's GET status and its admin PUT and DELETE)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from starlette.routing import Match
from starlette.types import Scope


def leaf_routes(routes: Iterable[Any]) -> Iterator[Any]:
    """The routes that have a path template, through included routers (FastAPI wraps each router it
    includes in an object that matches the whole router and names no route)."""
    for route in routes:
        if isinstance(getattr(route, "path", None), str):
            yield route
        else:
            yield from leaf_routes(getattr(getattr(route, "original_router", route), "routes", ()))


def allowed_methods(scope: Scope) -> list[str]:
    """The methods of every route of the app whose path matches the request's, sorted."""
    methods: set[str] = set()
    for route in leaf_routes(getattr(scope.get("app"), "routes", ())):
        if route.matches(scope)[0] is not Match.NONE:  # PARTIAL: the path matches, not the method
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)
