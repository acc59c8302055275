"""A route's ``rollout`` block, as tables (:mod:`.spec`): the plan a route walks on its own
(:class:`~control_plane.model.plan.Plan`). The same rows read a plan given to the API
(``PUT /v1/routes/{route}/plan``, :func:`read_plan`), so the file and the API accept the
same plans and refuse the same ones, naming the field (and, in a file, the line)::

    rollout:
      steps: [{shadow: 10m}, {canary: 10, for: 10m}, approve, enforce]
      analysis: {min_compared: 500, max_new_rejection_rate: 1%, max_backend_error_rate: 0.1%}
      on_failure: rollback

An analysis left out takes the promotion gate's settings (``SHADOWLIMIT_GATE_MIN_SAMPLES``,
``..._MAX_NEW_REJECTION_RATE``, ``SHADOWLIMIT_GATE_COUNTS``, ``..._MAX_BACKEND_ERROR_RATE``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..model.plan import OnFailure, Plan, PlanAnalysis, PlanStep, PrometheusCheck, StepKind, step_order_problem
from ..model.rollout import GATE_COUNTS, GATE_WEIGHTS
from .errors import FieldPath
from .fields import FieldReader, type_name
from .spec import Block, Got, Key, duration_schema, read_block

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["MAX_CHECKS", "MAX_STEPS", "PROMETHEUS_CHECK", "ROLLOUT", "STEP_FOR_MAX_S", "read_plan"]

STEP_FOR_MAX_S = 7 * 86400.0
"""The longest a step may ask to be held (a week)."""
MAX_STEPS = 20
"""The most steps a plan may have."""
MAX_CHECKS = 20
"""The most Prometheus checks a plan may have."""
_MAX_QUERY = 4096
_MAX_SAMPLES = 1_000_000_000

_STEP_NAMES = ", ".join(k.value for k in StepKind)
_DURATION = duration_schema(STEP_FOR_MAX_S, allow_zero=True)
_SHARE_PATTERN = r"^\s*(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*%\s*$"
_SHARE = {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "string", "pattern": _SHARE_PATTERN}]}
_URL_SCHEMA = {"type": "string", "pattern": r"^[hH][tT][tT][pP][sS]?://\S+$"}
_STEP_SCHEMA = {
    "anyOf": [
        {"enum": ["shadow", "approve", "enforce"]},
        {"type": "object", "properties": {"shadow": _DURATION}, "required": ["shadow"], "additionalProperties": False},
        {
            "type": "object",
            "properties": {"canary": {"type": "integer", "minimum": 1, "maximum": 99}, "for": _DURATION},
            "required": ["canary"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"enforce": _DURATION},
            "required": ["enforce"],
            "additionalProperties": False,
        },
    ]
}


def _for(r: FieldReader, value: Any, path: FieldPath) -> float:
    return r.duration(value, path, 0.0, STEP_FOR_MAX_S, allow_zero=True)


def _step(r: FieldReader, value: Any, path: FieldPath) -> PlanStep:
    """``shadow``, ``approve``, ``enforce``, or ``{shadow: 10m}``, ``{canary: 10, for: 10m}``, ``{enforce: 5m}``."""
    if isinstance(value, str):
        if value in ("shadow", "approve", "enforce"):
            return PlanStep(kind=StepKind(value))
        if value == "canary":
            raise r.error(path, "a canary step needs its percent: {canary: 10, for: 10m}")
        raise r.error(path, f"unknown step {value!r}; a step is one of {_STEP_NAMES}")
    if not isinstance(value, dict):
        raise r.error(path, f"must be a step ({_STEP_NAMES}), got {type_name(value)}")
    kinds = [k for k in value if k in ("shadow", "canary", "enforce", "approve")]
    if len(kinds) != 1:
        unknown = [k for k in value if k not in ("shadow", "canary", "enforce", "approve", "for")]
        if unknown:
            raise r.error((*path, unknown[0]), f"unknown step {unknown[0]!r}; a step is one of {_STEP_NAMES}")
        raise r.error(path, f"a step is one of {_STEP_NAMES}, got {' and '.join(kinds) or 'none'}")
    kind = StepKind(kinds[0])
    allowed = ("canary", "for") if kind is StepKind.CANARY else (kind.value,)
    r.mapping(value, path, allowed)
    if kind is StepKind.APPROVE:
        raise r.error((*path, "approve"), "approve takes no value: write the step as the word approve")
    if kind is StepKind.CANARY:
        percent = r.integer(value["canary"], (*path, "canary"), 1, 99)
        held = _for(r, value["for"], (*path, "for")) if "for" in value else 0.0
        return PlanStep(kind=kind, percent=percent, for_s=held)
    return PlanStep(kind=kind, for_s=_for(r, value[kind.value], (*path, kind.value)))


def _steps(r: FieldReader, value: Any, path: FieldPath, got: Got) -> tuple[PlanStep, ...]:
    if not isinstance(value, list):
        raise r.error(path, f"must be a list of steps ({_STEP_NAMES}), got {type_name(value)}")
    if len(value) > MAX_STEPS:
        raise r.error(path, f"at most {MAX_STEPS} steps, got {len(value)}")
    steps = tuple(_step(r, v, (*path, i)) for i, v in enumerate(value))
    problem = step_order_problem(steps)
    if problem is not None:
        index, why = problem
        raise r.error((*path, index) if steps else path, why)
    return steps


def _share(r: FieldReader, value: Any, path: FieldPath, got: Got) -> float:
    """A share: ``1%``, ``0.1%`` or a number from 0 to 1."""
    share: float | None = None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            share = None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        share = float(value)
    if share is None or not math.isfinite(share):
        raise r.error(path, f"must be a share: a percentage (1%, 0.1%) or a number from 0 to 1, got {value!r}")
    if not 0 <= share <= 1:
        raise r.error(path, f"must be from 0 to 1 (0% to 100%), got {value!r}")
    return share


def _number(r: FieldReader, value: Any, path: FieldPath, got: Got) -> float:
    if isinstance(value, str) and value.strip().endswith("%"):
        return _share(r, value, path, got)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise r.error(path, f"must be a number (or a percentage), got {type_name(value)} {value!r}")
    return float(value)


def _name(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    name = r.string(value, path).strip()
    if not name or len(name) > 100:
        raise r.error(path, "must be a name of 1 to 100 characters")
    return name


def _query(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    query = r.string(value, path)
    if not query.strip() or len(query) > _MAX_QUERY:
        raise r.error(path, f"must be a PromQL expression of 1 to {_MAX_QUERY} characters")
    return query


def _url(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    return r.service_url(value, path)


def _plan_url(got: Got) -> str | None:
    """The plan's own Prometheus (``analysis.url``), when a check names none."""
    try:
        url: str | None = got.outer("url")
    except KeyError:
        return None
    return url


def _build_check(r: FieldReader, got: Got, path: FieldPath) -> PrometheusCheck:
    lo, hi = got["min"], got["max"]
    if lo is None and hi is None:
        raise r.error(path, "give max (the value must stay at or below it), min (at or above it), or both")
    if lo is not None and hi is not None and lo > hi:
        raise r.error((*path, "min"), f"min {lo:g} is above max {hi:g}: no value could pass")
    return PrometheusCheck(name=got["name"], query=got["query"], max=hi, min=lo, url=got["url"])


PROMETHEUS_CHECK = Block(
    name="prometheus_check",
    keys=(
        Key(
            name="name",
            read=_name,
            required=True,
            schema={"type": "string", "minLength": 1, "maxLength": 100},
            doc="What the check is called in the analysis, the audit trail and the notifications.",
        ),
        Key(
            name="query",
            read=_query,
            required=True,
            schema={"type": "string", "minLength": 1, "maxLength": _MAX_QUERY},
            doc="A PromQL expression giving one number; `{route}` is replaced by the route's name.",
        ),
        Key(
            name="max",
            read=_number,
            absent=lambda r, got: None,
            schema={"anyOf": [{"type": "number"}, {"type": "string", "pattern": _SHARE_PATTERN}]},
            doc="The check fails above this value.",
        ),
        Key(
            name="min",
            read=_number,
            absent=lambda r, got: None,
            schema={"anyOf": [{"type": "number"}, {"type": "string", "pattern": _SHARE_PATTERN}]},
            doc="The check fails below this value. Give `max`, `min` or both.",
        ),
        Key(
            name="url",
            read=_url,
            absent=lambda r, got: _plan_url(got),
            schema=_URL_SCHEMA,
            default_doc="`analysis.url`, else `SHADOWLIMIT_PROMETHEUS_URL`",
            doc="The Prometheus to ask for this check (its base URL, `http://prometheus:9090`).",
        ),
    ),
    build=_build_check,
    schema_extra={"anyOf": [{"required": ["max"]}, {"required": ["min"]}]},
)
"""One Prometheus check of a plan's analysis."""


def _checks(r: FieldReader, value: Any, path: FieldPath, got: Got) -> tuple[PrometheusCheck, ...]:
    if not isinstance(value, list):
        raise r.error(path, f"must be a list of checks ({{name, query, max}}), got {type_name(value)}")
    if len(value) > MAX_CHECKS:
        raise r.error(path, f"at most {MAX_CHECKS} checks, got {len(value)}")
    checks: list[PrometheusCheck] = []
    for i, item in enumerate(value):
        check = read_block(r, PROMETHEUS_CHECK, item, (*path, i), got)
        if any(c.name == check.name for c in checks):
            raise r.error((*path, i, "name"), f"{check.name!r} is the name of an earlier check")
        checks.append(check)
    return tuple(checks)


def _gate_counts(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    if value not in GATE_COUNTS:
        raise r.error(path, f"must be all or tighter, got {value!r}")
    return str(value)


def _gate_weight(r: FieldReader, value: Any, path: FieldPath, got: Got) -> str:
    if value not in GATE_WEIGHTS:
        raise r.error(path, f"must be requests or cost, got {value!r}")
    return str(value)


def _setting(name: str) -> Any:
    return lambda r, got: getattr(r.settings, name)


ANALYSIS = Block(
    name="analysis",
    keys=(
        Key(
            name="min_compared",
            read=lambda r, v, p, got: r.integer(v, p, 1, _MAX_SAMPLES),
            absent=lambda r, got: max(1, r.settings.gate_min_samples),
            schema={"type": "integer", "minimum": 1, "maximum": _MAX_SAMPLES},
            default_doc="`SHADOWLIMIT_GATE_MIN_SAMPLES`",
            doc="Compared decisions a step needs before it is judged; fewer: inconclusive, the plan waits.",
        ),
        Key(
            name="max_new_rejection_rate",
            read=_share,
            absent=_setting("gate_max_new_rejection_rate"),
            schema=_SHARE,
            default_doc="`SHADOWLIMIT_GATE_MAX_NEW_REJECTION_RATE`",
            doc="The share of compared requests the global limit may newly reject (`1%`, `0.5%`, `0.01`).",
        ),
        Key(
            name="gate_counts",
            read=_gate_counts,
            absent=_setting("gate_counts"),
            schema={"enum": list(GATE_COUNTS)},
            default_doc="`SHADOWLIMIT_GATE_COUNTS`",
            doc="Which new rejections `max_new_rejection_rate` counts: `all`, or `tighter`, only those that are a "
            "change of policy (the leak across replicas, fresh buckets and clock skew left out: "
            "[why they disagree](rollout-runbook.md#why-they-disagree)).",
        ),
        Key(
            name="gate_weight",
            read=_gate_weight,
            absent=lambda r, got: "requests",
            schema={"enum": list(GATE_WEIGHTS)},
            default_doc="`requests`",
            doc="What `max_new_rejection_rate` weighs: `requests`, or `cost`, the share of what the compared "
            "requests cost that the new rejections would have cost (only on a route with a `budget` block).",
        ),
        Key(
            name="max_backend_error_rate",
            read=_share,
            absent=_setting("gate_max_backend_error_rate"),
            schema=_SHARE,
            default_doc="`SHADOWLIMIT_GATE_MAX_BACKEND_ERROR_RATE`",
            doc="The share of distributed evaluations that may fail (Redis errors, an open breaker).",
        ),
        Key(
            name="url",
            read=_url,
            absent=lambda r, got: None,
            schema=_URL_SCHEMA,
            default_doc="`SHADOWLIMIT_PROMETHEUS_URL`",
            doc="The Prometheus this plan's checks ask (its base URL, `http://prometheus:9090`); a check's own "
            "`url` wins.",
        ),
        Key(
            name="prometheus",
            read=_checks,
            absent=lambda r, got: (),
            schema={"type": "array", "maxItems": MAX_CHECKS, "items": PROMETHEUS_CHECK.json_schema()},
            default_doc="none",
            doc="Checks of the protected service's health, each `{name, query, max and/or min, url}` "
            "([below](#prometheus-checks-rolloutanalysisprometheus)).",
        ),
    ),
    build=lambda r, got, path: PlanAnalysis(
        min_compared=got["min_compared"],
        max_new_rejection_rate=got["max_new_rejection_rate"],
        max_backend_error_rate=got["max_backend_error_rate"],
        prometheus=got["prometheus"],
        gate_counts=got["gate_counts"],
        gate_weight=got["gate_weight"],
    ),
)


def _on_failure(r: FieldReader, value: Any, path: FieldPath, got: Got) -> OnFailure:
    if value not in [f.value for f in OnFailure]:
        raise r.error(path, f"must be rollback or pause, got {value!r}")
    return OnFailure(value)


ROLLOUT = Block(
    name="rollout",
    keys=(
        Key(
            name="steps",
            read=_steps,
            required=True,
            schema={"type": "array", "minItems": 1, "maxItems": MAX_STEPS, "items": _STEP_SCHEMA},
            doc="In order, each a step toward enforce: `shadow: 10m` (the time to hold it), `canary: 10` (percent "
            "of keys, 1-99) with `for: 10m`, `approve` (waits for an operator; never first nor last), `enforce` "
            "(or `enforce: 10m`, judged that long before the plan completes). Each waits at least its time and "
            "until its analysis passes.",
        ),
        Key(
            name="analysis",
            block=ANALYSIS,
            absent=lambda r, got: read_block(r, ANALYSIS, {}, ("rollout", "analysis"), got),
            doc="What must hold to leave a step (every check).",
        ),
        Key(
            name="on_failure",
            read=_on_failure,
            absent=lambda r, got: OnFailure.ROLLBACK,
            schema={"enum": [f.value for f in OnFailure]},
            default_doc="`rollback`",
            doc="A failed check: `rollback` (to the last step that passed, shadow at worst; the plan then pauses) "
            "or `pause` (the route stays where it is).",
        ),
    ),
    build=lambda r, got, path: Plan(steps=got["steps"], analysis=got["analysis"], on_failure=got["on_failure"]),
)
"""A route's ``rollout`` block."""


def read_plan(value: Any, settings: Settings, *, root: FieldPath = ()) -> Plan:
    """A plan given as data (an API body): the rules file's rows, errors naming the field
    from ``root`` (a :class:`~control_plane.rules.errors.RulesError` without a file or line)."""
    reader = FieldReader({}, None, settings)
    return read_block(reader, ROLLOUT, value, root)  # type: ignore[no-any-return]
