"""POST /v1/models/{name}:score — the request path: one route, one body description, one scorer path.

The route is built per app: its body model carries the app's --max-candidates as the list's max_length, so an
oversized candidate list is refused before its items are validated. The body is parsed by
``offgraph.server.api.score_body.ScoreBodyParser`` (one msgspec struct derived from the pydantic model, which
OpenAPI publishes and which words the 422s), its candidates always as their JSON bytes, for the scorer's
candidate cache: the route decides the wire format, once.

``build_route`` gives one FastAPI ``APIRoute``: documented in OpenAPI from its endpoint (the path parameter, the
docstring, the response model, the errors, the pydantic body schema) and answering with ``_ScoreRoute.answer``,
without FastAPI's dependency solving and request handler, which cost a fixed share of every request on the
event loop's one core (bench/results/serve-latency-lean/README.md). The checks run in the documented order:
body, then model name, then model: the candidates, left as sent for the scorer, are decoded before a 400 or 404
is answered, so a body with an invalid candidate is a 422 whatever the name or version. Another method is the
route's 405, naming the allowed one.
"""

import time
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from pydantic import Field, create_model
from starlette.routing import request_response

from offgraph.server.api.deps import Holder, get_holder, model_name
from offgraph.server.api.predict_scoring import arm_name as arm_label
from offgraph.server.api.predict_scoring import arm_version
from offgraph.server.api.schemas import CANDIDATES_DOC, Features, ScoreRequest, ScoreResponse, error_responses
from offgraph.server.api.score_body import ScoreBodyParser
from offgraph.server.config import ServerConfig
from offgraph.server.http.errors import ApiError
from offgraph.server.models.experiment import prior_scores
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


def score_model(config: ServerConfig) -> type[ScoreRequest]:
    """The score body's documented model, with the app's --max-candidates."""
    return create_model(
        "ScoreRequest",
        __base__=ScoreRequest,
        __doc__=ScoreRequest.__doc__,
        candidates=(
            list[Features],
            Field(min_length=1, max_length=config.max_candidates, description=CANDIDATES_DOC),
        ),
    )


async def _answer(body: Any, holder: Any, state: Any, request: Request) -> Response:
    """Score a parsed body on ``holder``'s serving version (in the scoring pool), or on its experiment's arm for
    the request (``offgraph.server.models.experiment``; a body naming a version or label bypasses the split),
    and answer."""
    metrics = state.metrics
    arm = None
    if body.version is None and body.label is None:
        exp = state.experiments.get(holder.name)
        if exp is not None:
            arm, assigned = exp.assign(body.request)
            if not assigned:
                metrics.unassigned.labels(holder.name).inc()
    arm_name = arm_label(arm)
    try:
        if arm is not None and arm.kind == "prior":
            version, scores, kind, unknown_candidates, unknown_request = (
                None,
                prior_scores(len(body.candidates)),
                "ranking",
                0,
                False,
            )
            joined = None
        else:
            version_asked, label = (body.version, body.label) if arm is None else arm.selection
            version, scores, joined, kind = await state.run_scoring(
                holder.score, body.request, body.candidates, version_asked, label
            )
            unknown_candidates, unknown_request = joined.unknown_candidates, joined.unknown_request
    except NotServing as e:
        metrics.count_arm_error(holder.name, arm_version(holder, arm, body.version, body.label), arm_name)
        body.candidates.dicts()  # the body is refused first: a candidate the model refuses is its 422, not this 404
        raise ApiError(404, str(e)) from None
    except Exception:
        metrics.count_arm_error(holder.name, arm_version(holder, arm, body.version, body.label), arm_name)
        raise
    n = len(body.candidates)
    seconds = time.perf_counter() - request.scope.get(START_KEY, 0.0)
    metrics.observe_score(holder.name, n, seconds)
    metrics.observe_arm(holder.name, version, arm_name, seconds, scores)
    if joined is None:  # the prior arm: the features as sent (no model, no join)
        state.log_served(holder.name, version, arm_name, body.request, body.candidates, scores)
    else:
        state.log_served(holder.name, version, arm_name, joined.request, joined.as_seen, scores)
    out = ScoreResponse(
        model=holder.name,
        version=version,
        scores=scores.tolist(),
        score_kind=kind,
        unknown_candidates=unknown_candidates,
        unknown_request=unknown_request,
        **({} if arm is None else {"arm": arm_name}),
    )
    # serialized by pydantic's own encoder: the default path re-validates the model and renders it with
    # json.dumps, which costs a float's repr per candidate in Python. exclude_unset: ``arm`` only in an experiment
    return Response(out.model_dump_json(exclude_unset=True), media_type="application/json")


class _ScoreRoute(APIRoute):
    """An ``APIRoute`` documented from its endpoint as any other, that answers with ``answer(request)`` instead of
    FastAPI's request handler (the endpoint's dependencies are published, never solved per request)."""

    def __init__(self, path: str, endpoint: Any, *, answer: Any, **kwargs: Any):
        self.answer = answer
        super().__init__(path, endpoint, **kwargs)
        self.app = request_response(answer)  # Starlette's: the request, the handler, its exceptions to the app's

    def get_route_handler(self) -> Any:
        return self.answer


def build_route(config: ServerConfig) -> APIRoute:
    """The score route of an app with ``config``'s --max-candidates."""
    parser = ScoreBodyParser(score_model(config), config.max_candidates)

    async def answer(request: Request) -> Response:
        state = request.state.server
        body = await parser.parse(request)
        try:
            holder = await get_holder(await model_name(request.path_params["name"]), state)
        except ApiError:  # the body is refused first: its candidates, left as sent, are decoded now (a 422)
            body.candidates.dicts()
            raise
        return await _answer(body, holder, state, request)

    async def score(holder: Holder) -> Response:
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
        raise AssertionError("documentation only: _ScoreRoute answers with answer()")  # pragma: no cover

    return _ScoreRoute(
        PATH,
        score,
        answer=answer,
        methods=["POST"],
        tags=["scoring"],
        response_model=ScoreResponse,
        responses=_ERRORS,
        summary="Score candidates",
        openapi_extra=parser.openapi_extra(),
    )
