"""The decision endpoints' bodies are read by their models (one parser): strict types, the
bounds the OpenAPI document states, the item count refused before any item is validated; a
validated request is what the decider reads; the plain ``{"route", "key"}`` recognised without
the model only as the model reads it; the rejection bodies."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
import pytest
from fastapi.exceptions import RequestValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from control_plane.api.decide import REJECTION, as_input, body_of, plain_request, read_batch, read_decide, rejected
from control_plane.api.requests import adapter, validate_body
from control_plane.api.schemas import MAX_BATCH, STRICT, BatchRequest, DecideRequest
from control_plane.decision import DecideInput, DecideResult

_H100 = {f"h{i}": "v" for i in range(100)}
#: per field: values the model takes, then values it refuses (strict: no conversion)
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


def _errors(raw: bytes, model: Any = BatchRequest) -> list[tuple[str, ...]]:
    try:
        validate_body(model, raw)
    except RequestValidationError as exc:
        return [tuple(str(p) for p in e["loc"]) for e in exc.errors()]
    return []


@pytest.mark.parametrize("field", list(_POOLS))
def test_each_field_takes_its_values_and_refuses_the_others_naming_the_field(field):
    ok, bad = _POOLS[field]
    for value in ok:
        raw = json.dumps({"requests": [{"route": "r", "key": "k", field: value}]}).encode()
        assert _errors(raw) == [], value
    for value in bad:
        raw = json.dumps({"requests": [{"route": "r", "key": "k", field: value}]}).encode()
        errors = _errors(raw)
        assert errors and errors[0][:4] == ("body", "requests", "0", field), (value, errors)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"requests": []}',
        b'{"requests": {}}',
        b'{"requests": [1]}',
        b'{"requests": [{"route": "a", "key": "k"}], "more": 1}',
        b'{"requests": [{"route": "a", "key": "k", "nope": 1}]}',
        b'{"requests": [{"route": "a", "key": "k\\ud800"}]}',
    ],
)
def test_malformed_batches_are_a_422(raw):
    assert _errors(raw)


def test_a_validated_request_is_what_the_decider_reads():
    """DecideRequest has DecideInput's fields: the usual route + key becomes the decider's plain
    tuple, anything else a DecideInput of the same fields."""
    assert list(DecideRequest.__annotations__) == [f.name for f in dataclasses.fields(DecideInput)]
    assert as_input(validate_body(DecideRequest, b'{"route": "a", "key": "k"}')) == ("a", "k", 1, None)
    assert as_input(validate_body(DecideRequest, b'{"route": "a", "key": "k", "cost": 2}')) == DecideInput(
        route="a", key="k", cost=2
    )
    assert as_input(validate_body(DecideRequest, b'{"route": null, "key": "k"}')) == DecideInput(key="k")
    full = b'{"method": "GET", "path": "/x", "client_ip": "10.0.0.1", "headers": {"a": "b"}, "request_id": "r"}'
    assert as_input(validate_body(DecideRequest, full)) == DecideInput(
        method="GET", path="/x", client_ip="10.0.0.1", headers={"a": "b"}, request_id="r"
    )


def _model(raw: bytes, model: Any = DecideRequest) -> Any:
    """What the model makes of ``raw`` for the decider, or ``"refused"``."""
    try:
        got = validate_body(model, raw)
    except RequestValidationError:
        return "refused"
    return [as_input(r) for r in got["requests"]] if model is BatchRequest else as_input(got)


def _read(read: Any, raw: bytes) -> Any:
    try:
        return read(raw)
    except RequestValidationError:
        return "refused"


_EDGES = ["", "a", " k", "x" * 64, "x" * 65, "x" * 256, "x" * 257, "é" * 64, "é" * 65, "é" * 256, "é" * 257, "\u2028"]
_VALUES = st.one_of(
    st.text(max_size=300), st.sampled_from(_EDGES), st.integers(), st.none(), st.booleans(), st.floats(),
    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)  # fmt: skip
_BODIES = st.dictionaries(st.sampled_from(["route", "key", "cost", "path", "request_id", "other"]), _VALUES, max_size=4)


@settings(max_examples=400, deadline=None)
@given(_BODIES)
def test_the_plain_request_is_recognised_only_as_the_model_reads_it(body):
    """plain_request says yes only where the model says yes, with the model's result; the
    endpoints' readers give what the model gives, for every body."""
    raw = json.dumps(body).encode()  # big integers and NaN too, for the JSON reader to refuse
    try:
        plain = plain_request(orjson.loads(raw))
    except orjson.JSONDecodeError:
        plain = None
    if plain is not None:
        assert plain == _model(raw)
    assert _read(read_decide, raw) == _model(raw)


@settings(max_examples=200, deadline=None)
@given(st.lists(_BODIES, max_size=4))
def test_a_batch_is_read_as_the_model_reads_it(items):
    raw = json.dumps({"requests": items}).encode()
    assert _read(read_batch, raw) == _model(raw, BatchRequest)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"route":"a","key":"b","key":"c"}',  # the last of a repeated name, as the model reads it
        b'{"route":"a","key":"b","route":"c"}',
        b' {"route":"a","key":"b"} ',
        b'\xef\xbb\xbf{"route":"a","key":"b"}',
        b'{"route":"a","key":"\\ud800"}',
        b'{"route":"a","key":"b"}\x00',
        b'{"route":"a","key":"b"',
        b'["a","b"]',
        b'"a"',
        b"",
        b'{"requests":[{"route":"a","key":"b"}]}',
    ],
)
def test_edges_of_the_json_are_read_as_the_model_reads_them(raw):
    assert _read(read_decide, raw) == _model(raw)
    batch = b'{"requests":[' + raw + b"]}"
    assert _read(read_batch, batch) == _model(batch, BatchRequest)


def test_the_bounds_of_a_plain_request_are_the_models():
    """Every route and key at and around the model's bounds (ASCII and not), and other types."""
    routes = ["", "a", "x" * 64, "x" * 65, "é" * 64, "é" * 65, None, 1]
    keys = ["", "k", "x" * 256, "x" * 257, "é" * 256, "é" * 257, None, 1]
    for route in routes:
        for key in keys:
            raw = orjson.dumps({"route": route, "key": key})
            plain = plain_request(orjson.loads(raw))
            assert plain is None or plain == _model(raw), (route, key)
            assert _read(read_decide, raw) == _model(raw), (route, key)


def test_a_batch_of_plain_requests_is_bounded_as_the_model_bounds_it():
    for n in (0, 1, MAX_BATCH, MAX_BATCH + 1):
        raw = orjson.dumps({"requests": [{"route": "a", "key": f"k{i}"} for i in range(n)]})
        assert _read(read_batch, raw) == _model(raw, BatchRequest)


def test_too_many_items_are_refused_before_any_is_looked_at():
    """More than MAX_BATCH items: the 422 names ``requests``, whatever the items are (each
    would be validated first otherwise)."""
    for items in ([{"route": "a", "key": "k"}] * 10_001, [1] * 20_000, [{"cost": "x"}] * 10_001):
        with pytest.raises(RequestValidationError) as info:
            validate_body(BatchRequest, orjson.dumps({"requests": items}))
        (err,) = info.value.errors()
        assert err["loc"] == ("body", "requests")
        assert err["msg"] == f"at most {MAX_BATCH} items per batch, got {len(items)}"
    ok = validate_body(BatchRequest, orjson.dumps({"requests": [{"route": "a", "key": "k"}] * 10_000}))
    assert len(ok["requests"]) == 10_000


def test_the_schema_states_the_bounds():
    """What the OpenAPI document tells clients is what the model checks."""
    schema = adapter(DecideRequest).json_schema()["properties"]

    def limits(name: str) -> dict[str, Any]:
        flat = dict(schema[name])
        for alt in schema[name].get("anyOf", []):
            flat.update(alt)
        return {k: flat[k] for k in ("minLength", "maxLength", "pattern", "minimum", "maximum") if k in flat}

    assert limits("route") == {"minLength": 1, "maxLength": 64}
    assert limits("method") == {"minLength": 1, "maxLength": 16, "pattern": "^[A-Za-z]+$"}
    assert limits("path") == {"minLength": 1, "maxLength": 2048, "pattern": "^/"}
    assert limits("key") == {"minLength": 1, "maxLength": 256}
    assert limits("client_ip") == {"maxLength": 64}
    assert limits("request_id") == {"maxLength": 128}
    assert limits("cost") == {"minimum": 1, "maximum": 1_000_000}
    assert schema["headers"]["maxProperties"] == 100
    req = adapter(BatchRequest).json_schema()["properties"]["requests"]
    assert (req["minItems"], req["maxItems"]) == (1, MAX_BATCH)
    for body in (DecideRequest, BatchRequest):
        assert body.__pydantic_config__ == STRICT  # type: ignore[attr-defined]
    assert STRICT == {"extra": "forbid", "strict": True, "allow_inf_nan": False}


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
    """A rejection's body: the decision's ``to_dict()`` form and the error fields."""

    def expected(result: DecideResult) -> dict[str, Any]:
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
    want = list(expected(r).items())
    assert list(body_of(r).items()) == want
    got = r.to_dict() if r.allowed else rejected(r.to_dict())
    assert list(got.items()) == want
