"""Pydantic models at the API edge (requests and responses).

Request bodies are :class:`StrictBody` models, every one read by
:func:`~.requests.validate_body` (pydantic-core's JSON parser): ``"5"``, ``5.0`` or ``true``
is not an integer and ``1`` or ``"true"`` not a boolean, ``NaN`` and ``Infinity`` not numbers,
unknown fields are refused (a 422 naming the field); a whole number where a float is expected
(``average``, ``period``) is fine. The decision bodies (:class:`DecideRequest`,
:class:`BatchRequest`) are typed dicts under the same strictness (:data:`STRICT`): validated
from the JSON without a model object per request, their one parser and their OpenAPI schema.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Required

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from ..model.reservation import MAX_RESERVATION_LENGTH


class ErrorBody(BaseModel):
    """Every error answer: a code, a text, and details such as ``field`` (the bad field),
    ``errors`` (every bad field of a body), ``needs`` (the role), ``limit``, ``incident``."""

    error: str
    message: str
    model_config = ConfigDict(extra="allow")


class StrictBody(BaseModel):
    """A JSON request body: one strictness for every endpoint (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


#: the bounds of a decide request's fields, shared by the model below and the batch
#: endpoint's hand-written check (``api/requests.py``): (min length, max length)
ROUTE_LEN = (1, 64)
METHOD_LEN = (1, 16)
PATH_LEN = (1, 2048)
KEY_LEN = (1, 256)
CLIENT_IP_LEN = (0, 64)
REQUEST_ID_LEN = (0, 128)
MAX_HEADERS = 100
COST_RANGE = (1, 1_000_000)
#: a charge's cost (``POST /v1/charge``, a settle's): 0 to limiter.policy.MAX_COST
CHARGE_RANGE = (0, 1_000_000_000)
#: a reservation's estimate (a decision's ``estimate``): 1 to limiter.policy.MAX_COST
ESTIMATE_RANGE = (1, 1_000_000_000)
#: the most settles in one ``POST /v1/settle/batch``
MAX_SETTLES = 1_000
#: the longest period of a runtime adjustment (``PUT /ratelimit/config``), seconds
ADJUST_MAX_PERIOD_S = 86_400


#: what every request body is read under (:class:`StrictBody` and the decision bodies alike)
STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


#: what an absent field of a decide request means (DecideInput's defaults), for the document
_NONE = {"default": None}


#: a decision's or a charge's fields, one definition each (the two request bodies share them)
_Route = Annotated[
    str | None,
    Field(
        min_length=ROUTE_LEN[0],
        max_length=ROUTE_LEN[1],
        description="Route name; or give method + path.",
        json_schema_extra=_NONE,
    ),
]
_Method = Annotated[
    str | None,
    Field(min_length=METHOD_LEN[0], max_length=METHOD_LEN[1], pattern=r"^[A-Za-z]+$", json_schema_extra=_NONE),
]
_Path = Annotated[
    str | None, Field(min_length=PATH_LEN[0], max_length=PATH_LEN[1], pattern=r"^/", json_schema_extra=_NONE)
]
_Key = Annotated[
    str | None,
    Field(
        min_length=KEY_LEN[0],
        max_length=KEY_LEN[1],
        description="Rate-limit key; or give client_ip + headers.",
        json_schema_extra=_NONE,
    ),
]
_ClientIp = Annotated[str | None, Field(max_length=CLIENT_IP_LEN[1], json_schema_extra=_NONE)]
_Headers = Annotated[dict[str, str], Field(max_length=MAX_HEADERS)]
_RequestId = Annotated[str | None, Field(max_length=REQUEST_ID_LEN[1], json_schema_extra=_NONE)]


@with_config(STRICT)
class DecideRequest(TypedDict, total=False):
    # no docstring: it would become the schema's description (the document describes the endpoint)
    route: _Route
    method: _Method
    path: _Path
    key: _Key
    client_ip: _ClientIp
    headers: _Headers
    cost: Annotated[int, Field(ge=COST_RANGE[0], le=COST_RANGE[1], json_schema_extra={"default": 1})]
    request_id: _RequestId
    estimate: Annotated[
        int,
        Field(
            ge=ESTIMATE_RANGE[0], le=ESTIMATE_RANGE[1],
            description="Reserve this many units (the input tokens plus max_tokens, say) on a route with a budget "
            "block, instead of spending a cost: the answer's reservation is then settled with the actual cost "
            "(POST /v1/settle).",
        ),
    ]  # fmt: skip


class DecisionModel(BaseModel):
    allowed: bool
    remaining: int
    limit: int
    retry_after_us: int
    reset_after_us: int


class DecideResponse(BaseModel):
    allowed: bool
    route: str
    mode: Literal["off", "shadow", "canary", "enforce"]
    canary_percent: int
    enforced_by: Literal["local", "distributed", "failure_policy"]
    key: str
    request_id: str
    status_code: int
    local: DecisionModel
    distributed: DecisionModel | None
    divergence: Literal["agree", "local_allow_distributed_deny", "local_deny_distributed_allow"] | None
    list_match: Literal["allow", "deny"] | None = None
    backend_error: str | None = None
    limits_source: Literal["external", "cache", "stale", "static"] | None = Field(
        None, description="Routes with external limits: where this decision's limits came from (null on other routes)."
    )
    backend_url: str | None = Field(
        None, description="A backend URL the limits service named for this key (allow-listed hosts only)."
    )
    headers: dict[str, str]
    estimate: int | None = Field(None, description="A reservation's (the request gave an estimate): its estimate.")
    reservation: str | None = Field(
        None,
        description="A reservation's id, to settle it with (POST /v1/settle); null when nothing was reserved "
        "(refused, or an allow-listed client: nothing to settle). Present only when the request gave an estimate.",
    )
    error: str | None = None
    message: str | None = None
    identifier: str | None = None


#: the most items in one /v1/decide/batch request
MAX_BATCH = 10_000


def _not_too_many(value: Any) -> Any:
    """More than MAX_BATCH items are refused before any is validated (pydantic would
    validate every one of them first)."""
    if isinstance(value, list) and len(value) > MAX_BATCH:
        raise PydanticCustomError(
            "too_long", "at most {most} items per batch, got {n}", {"most": MAX_BATCH, "n": len(value)}
        )
    return value


@with_config(STRICT)
class BatchRequest(TypedDict):
    requests: Annotated[list[DecideRequest], BeforeValidator(_not_too_many), Field(min_length=1, max_length=MAX_BATCH)]


@with_config(STRICT)
class ChargeRequest(TypedDict, total=False):
    route: _Route
    method: _Method
    path: _Path
    key: _Key
    client_ip: _ClientIp
    headers: _Headers
    cost: Required[
        Annotated[
            int,
            Field(
                ge=CHARGE_RANGE[0], le=CHARGE_RANGE[1],
                description="What the request cost, known after its answer (tokens, bytes): counted whatever is left.",
            ),
        ]
    ]  # fmt: skip
    request_id: _RequestId


@with_config(STRICT)
class ChargeBatchRequest(TypedDict):
    charges: Annotated[list[ChargeRequest], BeforeValidator(_not_too_many), Field(min_length=1, max_length=MAX_BATCH)]


class ChargeResponse(BaseModel):
    route: str
    key: str
    cost: int
    over: bool = Field(
        description="The charge took the key past its budget (a request of that cost would have been refused)."
    )
    remaining: int = Field(description="What is left after the charge, in the route's units: negative in debt.")
    limit: int
    retry_after_us: int = Field(description="The wait until a request of one unit would be allowed (0: now).")
    reset_after_us: int
    mode: Literal["off", "shadow", "canary", "enforce"]
    enforced_by: Literal["local", "distributed", "failure_policy"]
    request_id: str
    local: DecisionModel
    distributed: DecisionModel | None
    backend_error: str | None = None


class BatchItemError(BaseModel):
    error: str
    message: str
    index: int
    field: str | None = None
    status: int = Field(
        ..., description="The status /v1/decide would answer for this item alone: 404, 422, or 500 (internal_error)."
    )
    incident: str | None = Field(
        None, description="internal_error only: the id the control plane logged the failure under."
    )


class BatchResponse(BaseModel):
    decisions: list[DecideResponse | BatchItemError]


class ChargeBatchResponse(BaseModel):
    charges: list[ChargeResponse | BatchItemError]


@with_config(STRICT)
class SettleRequest(TypedDict):
    reservation: Annotated[
        str,
        Field(
            min_length=1, max_length=MAX_RESERVATION_LENGTH,
            description="The id a decision with an estimate answered with.",
        ),
    ]  # fmt: skip
    cost: Annotated[
        int,
        Field(
            ge=CHARGE_RANGE[0], le=CHARGE_RANGE[1],
            description="What the request really cost: the difference from the estimate is refunded or charged.",
        ),
    ]  # fmt: skip


def _not_too_many_settles(value: Any) -> Any:
    if isinstance(value, list) and len(value) > MAX_SETTLES:
        raise PydanticCustomError(
            "too_long", "at most {most} settles per batch, got {n}", {"most": MAX_SETTLES, "n": len(value)}
        )
    return value


@with_config(STRICT)
class SettleBatchRequest(TypedDict):
    settles: Annotated[
        list[SettleRequest], BeforeValidator(_not_too_many_settles), Field(min_length=1, max_length=MAX_SETTLES)
    ]


class SettledSide(BaseModel):
    status: Literal["settled", "again", "unknown", "charged", "released"] = Field(
        description="What this side said: settled now, settled before (again), unknown here, or expired first "
        "(its estimate charged or released)."
    )
    decision: DecisionModel | None


class SettleResponse(BaseModel):
    reservation: str
    route: str
    key: str
    status: Literal["settled", "again"] = Field(
        description="settled: now; again: settled before, and this is the first answer (nothing charged now)."
    )
    estimate: int
    cost: int = Field(description="The actual cost the reservation was settled at (the first settle's).")
    over: bool = Field(description="The key is past its budget after the settle (in debt, or past a window's limit).")
    remaining: int = Field(description="What is left after the settle, in the route's units: negative in debt.")
    limit: int
    retry_after_us: int = Field(description="The wait until a request of one unit would be allowed (0: now).")
    reset_after_us: int
    mode: Literal["off", "shadow", "canary", "enforce"]
    enforced_by: Literal["local", "distributed"] = Field(description="The side whose answer this is.")
    local: SettledSide
    distributed: SettledSide | None = Field(description="null: the distributed store was not asked.")
    backend_error: str | None = None


class SettleBatchResponse(BaseModel):
    settles: list[SettleResponse | BatchItemError]


class BookRecord(BaseModel):
    state: Literal["outstanding", "settled", "charged", "released"]
    estimate: int
    actual: int | None
    age_us: int
    due_in_us: int = Field(description="Until an outstanding one expires, or an ended one is forgotten.")


class BookModel(BaseModel):
    outstanding: int
    settled: int
    charged: int
    released: int
    records: list[BookRecord]


class ReservationsResponse(BaseModel):
    route: str
    key: str
    local: BookModel = Field(description="As this replica's local limiter holds them.")
    distributed: BookModel | None = Field(description="As Redis holds them (null: it could not answer).")
    backend_error: str | None = None
    max_reservations: int | None = Field(description="The route's bound per key (null: the route has no budget).")


class ModeChange(StrictBody):
    mode: Literal["off", "shadow", "canary", "enforce"]
    canary_percent: int = Field(0, ge=0, le=100)
    reason: str = Field(..., min_length=1, max_length=500)
    force: bool = False


class CandidateSet(StrictBody):
    """A route's candidate limit: evaluated in shadow beside its current one until promoted
    or dropped."""

    limit: str = Field(
        ...,
        min_length=1,
        max_length=100,
        description='The candidate limit as text: "20/second", "100/minute", "1000 per hour" (burst defaults to'
        " the quantity).",
    )
    burst: int | None = Field(None, ge=1, le=1_000_000_000_000)
    algorithm: Literal["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"] | None = Field(
        None, description="Default: the route's current algorithm."
    )
    cost_unit: str | None = Field(
        None, max_length=32, description="A budget's unit (tokens): must be the route's own cost_unit when given."
    )
    reason: str = Field(..., min_length=1, max_length=500)


class CandidateAction(StrictBody):
    """Promote (``force`` passes the gate, said in the audit trail) or drop a candidate."""

    reason: str = Field(..., min_length=1, max_length=500)
    force: bool = False


class PlanSet(StrictBody):
    """A route's rollout plan, as the rules file's ``rollout`` block has it (JSON for YAML), and
    why it is set. It wins over the rules file's plan until it is deleted."""

    steps: list[str | dict[str, Any]] = Field(
        ...,
        min_length=1,
        max_length=20,
        description='In order, each a step toward enforce: {"shadow": "10m"}, {"canary": 10, "for": "10m"}, "approve",'
        ' "enforce" (or {"enforce": "10m"}).',
    )
    analysis: dict[str, Any] | None = Field(
        None,
        description="min_compared, max_new_rejection_rate, gate_counts, max_backend_error_rate, prometheus (checks of"
        " {name, query, max, min, url}); what is left out is the promotion gate's settings'.",
    )
    on_failure: Literal["rollback", "pause"] | None = Field(None, description="Default rollback.")
    reason: str = Field(..., min_length=1, max_length=500)


class PlanAct(StrictBody):
    """Why an operator pauses, resumes, approves, aborts or deletes a plan."""

    reason: str = Field(..., min_length=1, max_length=500)


class ConfigAdjust(StrictBody):
    """The admin API's ``adjust``: change a route's limit (or one key's) at runtime, fleet-wide."""

    route: str = Field("default", min_length=1, max_length=256)
    key: str | None = Field(
        None, min_length=1, max_length=256, description="One client's key; omit for the whole route."
    )
    target: Literal["local", "distributed", "both"] = "both"
    limit: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description='The limit as text, instead of average and period: "100/minute", "5/1s", "1000 per hour", '
        '"100/5 minutes" (burst defaults to the quantity).',
    )
    average: float | None = Field(
        None, ge=0, le=1e12, description="Tokens per period; 0 = unlimited. Required unless limit (or clear) is given."
    )
    period: float | None = Field(
        None, ge=0.001, le=ADJUST_MAX_PERIOD_S, description="Seconds, with average (default 1.0)."
    )
    burst: int | None = Field(None, ge=1, le=1_000_000_000_000)
    algorithm: Literal["token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log"] | None = None
    reason: str = Field("adjusted via API", min_length=1, max_length=500)
    clear: bool = Field(False, description="Remove the adjustment instead.")
