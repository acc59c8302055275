"""The batch endpoint's hand-written body check (``control_plane.api.requests.parse_batch``)
gives exactly what pydantic + ``to_input`` give, or steps aside; strict types on both
sides; the item count is refused before any item is validated; the rejection bodies."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from control_plane.api.decide import REJECTION, body_of, rejected
from control_plane.api.deps import ApiError
from control_plane.api.requests import parse_batch, to_input
from control_plane.api.schemas import MAX_BATCH, BatchRequest, DecideRequest
from control_plane.decision import DecideInput, DecideResult

# --------------------------------------------------------------------------- endpoint


def _pydantic_inputs(raw: bytes) -> list[Any] | None:
    try:
        req = BatchRequest.model_validate_json(raw)
    except Exception:  # noqa: BLE001
        return None
    out: list[Any] = []
    for item in req.requests:
        try:
            out.append(to_input(item))
        except ApiError as exc:
            out.append(exc)
    return out


def _norm_inputs(items: list[Any]) -> list[Any]:
    """Comparable forms; types count too (``True == 1``, but a bool cost is an error)."""
    out: list[Any] = []
    for x in items:
        if isinstance(x, ApiError):
            out.append((x.status, x.error, x.message, x.details))
        elif type(x) is tuple:  # a PlainInput
            assert len(x) == 4
            out.append(_norm_inputs([DecideInput(route=x[0], key=x[1], cost=x[2], request_id=x[3])])[0])
        else:
            out.append(
                [
                    (f, type(getattr(x, f)), getattr(x, f))
                    for f in ("route", "method", "path", "key", "client_ip", "headers", "cost", "request_id")
                ]
            )
    return out


_H100 = {f"h{i}": "v" for i in range(100)}
#: per field: values pydantic takes, then values it refuses or converts
_POOLS: dict[str, tuple[list[Any], list[Any]]] = {
    "route": ([None, "a", "api", "x" * 64, "é", " r "], ["x" * 65, "", 5]),
    "method": ([None, "GET", "get", "x" * 16], ["A" * 17, "", "GET\n", "PÖST", "G1", 1, "ǅ"]),
    "path": ([None, "/", "/a/b", "/" + "x" * 2047, "/é"], ["/" + "x" * 2048, "a", "", 3]),
    "key": ([None, "k", "x" * 256, "é" * 256, " k"], ["x" * 257, "", "é" * 257, 1]),
    "client_ip": ([None, "", "10.0.0.1", "x" * 64], ["x" * 65, 7]),
    "headers": (
        [{}, {"a": "b"}, {"X-Client-Id": "c"}, _H100],
        [{"a": 1}, None, [], "h", {**_H100, "one-more": "v"}, {"a": None}],
    ),
    "cost": ([1, 2, 10**6], [10**6 + 1, 0, -1, 1.0, 2.5, True, False, "2", None, 10**20]),
    "request_id": ([None, "", "r", "x" * 128], ["x" * 129, 5]),
}
_item = st.tuples(
    st.fixed_dictionaries(
        {},
        optional={
            f: st.sampled_from(ok) | st.sampled_from(ok) | st.sampled_from(ok) | st.sampled_from(bad)
            for f, (ok, bad) in _POOLS.items()
        },
    ),
    st.sampled_from([False] * 9 + [True]),
).map(lambda t: {**t[0], "extra": 1} if t[1] else t[0])  # "extra" is not a field
TAKEN: list[bool] = []


@settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(st.lists(_item, min_size=0, max_size=3), st.sampled_from(["plain"] * 6 + ["extra", "list"]))
def test_fast_body_check_agrees_with_pydantic(items, shape):
    body: Any = {"requests": items} if shape == "plain" else {"requests": items, "x": 1} if shape == "extra" else items
    raw = json.dumps(body).encode()
    fast = parse_batch(raw)
    slow = _pydantic_inputs(raw)
    TAKEN.append(fast is not None)
    if fast is not None:  # taken: pydantic must agree exactly
        assert slow is not None
        assert _norm_inputs(fast) == _norm_inputs(slow)
    else:  # both strict: what the fast check leaves to pydantic, pydantic refuses too
        assert slow is None, items


@pytest.mark.parametrize(
    "body",
    [
        {"requests": [{"route": "api", "key": "b1"}]},
        {"requests": [{"route": "api", "key": "b1", "cost": 3, "request_id": "r"}, {"route": "api"}, {"key": "x"}]},
        {
            "requests": [
                {"method": "GET", "path": "/a", "headers": {"X-Client-Id": "z"}},
                {"method": "post", "path": "/b", "client_ip": "10.0.0.1"},
            ]
        },
        {
            "requests": [
                {"route": "api", "key": "k", "headers": {}},
                {"route": "api", "client_ip": ""},
                {"route": "r", "request_id": ""},
            ]
        },
    ],
)
def test_plain_bodies_take_the_fast_check(body):
    raw = orjson.dumps(body)
    fast = parse_batch(raw)
    assert fast is not None
    assert _norm_inputs(fast) == _norm_inputs(_pydantic_inputs(raw))


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"requests": []}',
        b'{"requests": {}}',
        b'{"requests": [1]}',
        b'{"requests": [{"route": "a", "key": "k", "cost": 1.0}]}',
        b'{"requests": [{"route": "a", "key": "k", "cost": "2"}]}',
        b'{"requests": [{"route": "a", "key": "k", "cost": true}]}',
        b'{"requests": [{"route": "a", "key": "k"}], "more": 1}',
        b'{"requests": [{"route": "a", "key": "k", "nope": 1}]}',
        b'\xef\xbb\xbf{"requests": [{"route": "a", "key": "k"}]}',
        b'{"requests": [{"route": "a", "key": "k\\ud800"}]}',
    ],
)
def test_anything_unusual_goes_to_pydantic(raw):
    assert parse_batch(raw) is None


@pytest.mark.parametrize("cost", ["1.0", "2.0", '"2"', "true", "false", "null", "1e2"])
def test_a_cost_that_is_not_an_integer_is_refused_by_both(cost):
    """Strict types: neither check turns a float, a string or a bool into a cost."""
    raw = b'{"requests": [{"route": "a", "key": "k", "cost": %s}]}' % cost.encode()
    assert parse_batch(raw) is None
    with pytest.raises(ValidationError) as info:
        BatchRequest.model_validate_json(raw)
    assert info.value.errors()[0]["loc"] == ("requests", 0, "cost")


def test_too_many_items_are_refused_before_any_is_looked_at():
    """More than MAX_BATCH items: the 422 names ``requests``, whatever the items are
    (pydantic would validate every one of them first)."""
    from fastapi.exceptions import RequestValidationError

    for items in ([{"route": "a", "key": "k"}] * 10_001, [1] * 20_000, [{"cost": "x"}] * 10_001):
        with pytest.raises(RequestValidationError) as info:
            parse_batch(orjson.dumps({"requests": items}))
        (err,) = info.value.errors()
        assert err["loc"] == ("body", "requests") and f"got {len(items)}" in err["msg"]
    assert parse_batch(orjson.dumps({"requests": [{"route": "a", "key": "k"}] * 10_000})) is not None


def test_fast_body_check_mirrors_the_schema():
    """The batch body check and the models share the bounds (``schemas``): the JSON schema
    still says what the check assumes."""
    schema = DecideRequest.model_json_schema()["properties"]

    def limits(name: str) -> dict[str, Any]:
        p = schema[name]
        flat = dict(p)
        for alt in p.get("anyOf", []):
            flat.update(alt)
        return {k: flat.get(k) for k in ("minLength", "maxLength", "pattern", "minimum", "maximum", "maxProperties")}

    assert (
        set(schema)
        == set(DecideInput.__dataclass_fields__)
        == {"route", "method", "path", "key", "client_ip", "headers", "cost", "request_id"}
    )
    assert limits("route") == {
        "minLength": 1,
        "maxLength": 64,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("method") == {
        "minLength": 1,
        "maxLength": 16,
        "pattern": "^[A-Za-z]+$",
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("path") == {
        "minLength": 1,
        "maxLength": 2048,
        "pattern": "^/",
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("key") == {
        "minLength": 1,
        "maxLength": 256,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("client_ip") == {
        "minLength": None,
        "maxLength": 64,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("request_id") == {
        "minLength": None,
        "maxLength": 128,
        "pattern": None,
        "minimum": None,
        "maximum": None,
        "maxProperties": None,
    }
    assert limits("cost") == {
        "minLength": None,
        "maxLength": None,
        "pattern": None,
        "minimum": 1,
        "maximum": 1_000_000,
        "maxProperties": None,
    }
    assert limits("headers")["maxProperties"] == 100
    assert DecideRequest.model_config.get("extra") == "forbid" and BatchRequest.model_config.get("extra") == "forbid"
    req = BatchRequest.model_json_schema()["properties"]["requests"]
    assert (req["minItems"], req["maxItems"]) == (1, 10_000) == (1, MAX_BATCH)
    # strict types on both sides (a test above checks the fast side by hand)
    assert DecideRequest.model_config.get("strict") is True and BatchRequest.model_config.get("strict") is True


def _result(**kw: Any) -> DecideResult:
    from control_plane.decision import Path
    from limiter.policy import make_decision

    allowed = kw.pop("allowed", False)
    local = make_decision(allowed, 0, 5, 0 if allowed else 100, 200)
    base: dict[str, Any] = dict(
        route="r", mode="enforce", canary_percent=0, enforced_by="local", key="k:1", path=Path.DISTRIBUTED,
        enforced=local, local=local, status_code=429, headers={"X-RateLimit-Limit": "5"}, request_id="id",
    )  # fmt: skip
    base.update(kw)
    return DecideResult(**base)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"allowed": True, "status_code": 200},
        {"list_match": "deny", "status_code": 403},
        {"enforced_by": "failure_policy", "status_code": 503, "backend_error": "down"},
        {"enforced_by": "distributed", "list_match": "allow"},
        {"limits_source": "stale", "backend_url": "http://x"},
    ],
)
def test_rejected_body_is_body(kw):
    """The batch endpoint's bodies (``rejected`` on dicts) are what ``body_of`` makes of a
    DecideResult (the original code, kept here)."""

    def original_body(result: DecideResult) -> dict[str, Any]:
        body = result.to_dict()
        if not result.allowed:
            body.update(REJECTION)
            body["identifier"] = f"{result.route}:{result.key}"
            if result.list_match == "deny":
                body["error"] = "denied"
                body["message"] = "This client is on the route's deny list."
            elif result.enforced_by == "failure_policy":
                body["message"] = "The rate-limit backend is unavailable and this route fails closed."
        return body

    r = _result(**kw)
    want = list(original_body(r).items())
    assert list(body_of(r).items()) == want
    got = r.to_dict() if r.allowed else rejected(r.to_dict())
    assert list(got.items()) == want


def test_zz_generated_bodies_often_take_the_fast_check():
    """The generated bodies above are not mostly refused (which would test nothing)."""
    if len(TAKEN) > 100:  # the generated test ran in this session
        assert sum(TAKEN) > len(TAKEN) // 10, (sum(TAKEN), len(TAKEN))
