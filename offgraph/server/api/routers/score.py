"""POST /v1/models/{name}:score — the request path.

The router is built per app: its request model carries the app's --max-candidates as the
list's max_length, so an oversized candidate list is refused before its items are validated.
The body is parsed by ``offgraph.server.api.score_body`` (msgspec for valid bodies, the pydantic model,
which OpenAPI publishes, for the 422s).

The route is served twice over: ``build_router``'s FastAPI route is the documented one (OpenAPI, the 405 of
another method), and ``lean_route`` answers its POSTs first, without FastAPI's dependency solving and
request handler, which cost a fixed share of every request on the event loop's one core
(bench/results/serve-latency-lean/README.md). Both call ``_answer``: the same checks in the same order
(body, then model name, then model), the same errors and the same answer.
"""

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field, create_model
from starlette.routing import Match, Route
from starlette.types import Scope

from offgraph.server.api.deps import Holder, State, get_holder, model_name
from offgraph.server.api.schemas import CANDIDATES_DOC, Features, ScoreRequest, ScoreResponse, error_responses
from offgraph.server.api.score_body import RawScoreBodyParser, ScoreBodyParser
from offgraph.server.config import ServerConfig
from offgraph.server.http.errors import ApiError
from offgraph.server.models.served import NotServing
from offgraph.server.process.metrics import START_KEY

_ERRORS = error_responses(
    e400="Invalid model name.",
    e404="Unknown model, or the version (or label) asked for does not serve.",
    e413="Body larger than the server's limit.",
    e415="The body's Content-Type is not JSON.",
    e422="Invalid body: the message names each problem (invalid JSON, NaN/Infinity, a number beyond the float64 "
    "range, nested objects, no candidates, too many candidates, a value the feature generation cannot use, an "
    "input sent in the other scope's place).",
)


PATH = "/v1/models/{name}:score"


class ScoreParsers:
    """The score body's documented model (with the app's --max-candidates) and its two parsers."""

    def __init__(self, config: ServerConfig):
        self.model = create_model(
            "ScoreRequest",
            __base__=ScoreRequest,
            __doc__=ScoreRequest.__doc__,
            candidates=(
                list[Features],
                Field(min_length=1, max_length=config.max_candidates, description=CANDIDATES_DOC),
            ),
        )
        self.raw = RawScoreBodyParser(self.model, config.max_candidates)
        self.plain = ScoreBodyParser(self.model, config.max_candidates)

    async def parse(self, request: Request, state: Any) -> Any:
        # the candidates as sent where the serving version's candidate cache will look them up, else decoded
        # (Scorer.takes_raw); the same checks and 422s either way. An unknown model is the route's 404, later.
        holder = state.models.holders.get(request.path_params.get("name", ""))
        return await (self.raw if holder is not None and holder.takes_raw() else self.plain).parse(request)


async def _answer(body: Any, holder: Any, state: Any, request: Request) -> Response:
    """Score a parsed body on ``holder``'s serving version (in the scoring pool) and answer."""
    try:
        version, scores, joined, kind = await state.run_scoring(
            holder.score, body.request, body.candidates, body.version, body.label
        )
    except NotServing as e:
        raise ApiError(404, str(e)) from None
    n = len(body.candidates)
    state.metrics.observe_score(holder.name, n, time.perf_counter() - request.scope.get(START_KEY, 0.0))
    out = ScoreResponse(
        model=holder.name,
        version=version,
        scores=scores.tolist(),
        score_kind=kind,
        unknown_candidates=joined.unknown_candidates,
        unknown_request=joined.unknown_request,
    )
    # serialized by pydantic's own encoder: the default path re-validates the model and renders it with
    # json.dumps, which costs a float's repr per candidate in Python
    return Response(out.model_dump_json(), media_type="application/json")


class _LeanRoute(Route):
    """A Starlette route that takes only what it answers in full (a POST to its path) and records itself as
    the request's route, as FastAPI's routes do (the error counters' route label, ``metrics.route_of``).
    Any other method falls through to the documented route, whose 405 names the allowed ones."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is not Match.FULL:
            return Match.NONE, {}
        child["route"] = self
        return match, child


def lean_route(config: ServerConfig, parsers: ScoreParsers | None = None) -> Route:
    """The score route without FastAPI's request handling, for the app's router to try first (``parsers``:
    the documented route's, so that the app builds the body model and its decoders once)."""
    parsers = parsers or ScoreParsers(config)

    async def score(request: Request) -> Response:
        state = request.state.server
        body = await parsers.parse(request, state)
        holder = await get_holder(await model_name(request.path_params["name"]), state)
        return await _answer(body, holder, state, request)

    return _LeanRoute(PATH, score, methods=["POST"], include_in_schema=False)


def build_router(config: ServerConfig, parsers: ScoreParsers | None = None) -> APIRouter:
    router = APIRouter(tags=["scoring"])
    parsers = parsers or ScoreParsers(config)
    parser = parsers.raw

    async def score_body(request: Request, state: State) -> Any:
        return await parsers.parse(request, state)

    @router.post(
        PATH,
        response_model=ScoreResponse,
        responses=_ERRORS,
        summary="Score candidates",
        openapi_extra=parser.openapi_extra(),
    )
    async def score(
        body: Annotated[Any, Depends(score_body)], holder: Holder, state: State, request: Request
    ) -> Response:
        """Scores of the candidates for one request, in candidate order, and the model version that made them.
        `score_kind` says what they are: `ctr`, calibrated CTRs (probabilities of a positive); `ranking`, scores
        that order the candidates but are not probabilities (a listwise model exported without a fitted
        calibration).

        Feature names are the model's raw input names (`GET /v1/models/{name}` lists them under `inputs`).
        Values are strings, finite numbers, booleans, null, or lists of those. A missing key, null, "" or []
        is *no value* (a zero embedding); keys the model does not read are **ignored** (and counted in
        `offgraph_ignored_keys_total{model}`); a request-scope input inside a candidate, or an item-scope input
        in the request, is a 422 naming the key and where it belongs (it would be no value there).

        **Ids-only requests**: for a model whose spec declares feature `tables`, the server fills every
        input the body does not send from the tables, by key (`{"request": {"user_id": 196}, "candidates":
        [{"movie_id": 242}]}`); a value sent in the body overrides the stored one (even null). Unknown keys
        fill nothing: `unknown_candidates` counts them. A request that sends only a key in a scope no table of the
        model fills (a model without tables) is a 422.
        """
        return await _answer(body, holder, state, request)

    return router
