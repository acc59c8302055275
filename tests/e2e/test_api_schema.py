"""The control plane's own OpenAPI document: a property-based run over it (schemathesis 4):
every operation (except the endless ``/v1/stream``) against a live server on loopback with
real Redis, with the admin token so mutating endpoints are exercised too (no response may
be a 5xx, every response must match the schema), one operation at a time and in sequences
that follow the document's links (the stateful phase: a route enforced, then listed, ...);
what the document must declare (a typed answer, the error body, the bearer scheme from the
access table, an example each, the rate-limit headers, the event stream, the links),
checked against real answers; and ``/docs`` and ``/redoc`` loading nothing from another
host."""

from __future__ import annotations

import re
import uuid
from collections import Counter

import httpx
import jsonschema_rs
import pytest
import schemathesis
from cp_server import RULES_YAML, ControlPlaneServer, admin_headers, write_rules
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from control_plane.api.authz import AUTHZ_METHODS
from control_plane.api.responses import AuditTrail, Readiness, RoutesList, RuleView
from control_plane.auth import ACCESS, Access

#: every answer: no 5xx, a status, media type, headers and body the document declares
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def live_cp(redis_server, tmp_path_factory):
    rules = write_rules(tmp_path_factory.mktemp("schema-rules"))
    # gate_min_samples=0: generated promotions pass the gate and really change modes
    server = ControlPlaneServer(redis_url=redis_server.url, rules_path=rules, gate_min_samples=0)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def api_schema(live_cp):
    schema = schemathesis.openapi.from_url(live_cp.url + "/openapi.json")
    return schema


schema = schemathesis.pytest.from_fixture("api_schema").exclude(path="/v1/stream")


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_api_conforms_to_its_schema(case, live_cp):
    case.call_and_validate(base_url=live_cp.url, headers=admin_headers(), checks=CHECKS, timeout=10)


#: the usual rules and a route with a budget, whose reservations the sequences settle
BUDGET_RULES = (
    RULES_YAML
    + """  - name: chat
    match: {methods: [POST], path: /api/chat}
    key: {strategy: header, header: X-Client-Id}
    local: {average: 100000, period: 60s, burst: 100000}
    budget: {reservation_ttl: 60s}
"""
)


@pytest.fixture
def stateful_cp(redis_server, tmp_path):
    """A control plane of its own: the sequences enforce routes, adjust limits, reset keys,
    reserve and settle."""
    rules = write_rules(tmp_path, BUDGET_RULES)
    server = ControlPlaneServer(redis_url=redis_server.url, rules_path=rules, gate_min_samples=0)
    server.start()
    yield server
    server.stop()


def test_api_conforms_to_its_schema_in_sequences(stateful_cp):
    """schemathesis' stateful phase: sequences of calls that follow the document's links (a
    route name from ``GET /v1/routes`` into a mode change, then the routes listed again, a
    decision's key into a reset, ...), so answers are checked in the states calls lead to
    (an enforced route has no next step and no gate); every operation is reached. A round
    is 100 sequences of up to 10 calls (about 5 s); the first is derandomized, another
    (at most two) runs only if an operation was not reached yet."""
    cp = stateful_cp
    schema = schemathesis.openapi.from_url(cp.url + "/openapi.json").exclude(path="/v1/stream")
    every = {result.ok().label for result in schema.get_all_operations()}
    assert len(every) >= 25
    called: Counter[str] = Counter()

    class Workflow(schema.as_state_machine()):
        def get_call_kwargs(self, case):
            return {"base_url": cp.url, "headers": admin_headers(), "timeout": 10}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            called[case.operation.label] += 1
            case.validate_response(response, checks=CHECKS, transport_kwargs=kwargs)

    for first in (True, False, False):
        Workflow.run(
            settings=settings(
                max_examples=100,
                stateful_step_count=10,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=first,
                database=None,
            )
        )
        if every <= set(called):
            break
    assert every <= set(called), f"not reached by any sequence: {sorted(every - set(called))}"


# -- the document itself -------------------------------------------------------------------

RATE_LIMIT = {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"}
DECISION_OPS = [("post", "/v1/decide")] + [(m.lower(), "/v1/authz") for m in AUTHZ_METHODS]


@pytest.fixture(scope="module")
def spec(live_cp):
    r = httpx.get(live_cp.url + "/openapi.json", timeout=10)
    assert r.status_code == 200
    return r.json()


def _operations(spec):
    return [(m, path, op) for path, item in spec["paths"].items() for m, op in item.items()]


def _validator(spec, schema):
    return jsonschema_rs.Draft202012Validator({**schema, "components": spec["components"]})


def _check(spec, schema, instance, what):
    errors = [
        f"{'/'.join(map(str, e.instance_path))}: {e.message}" for e in _validator(spec, schema).iter_errors(instance)
    ]
    assert not errors, f"{what} does not match its schema: {errors[:5]}"


def test_every_operation_declares_a_typed_success_answer(spec):
    ops = _operations(spec)
    assert len(ops) >= 25
    bodyless = []
    for method, path, op in ops:
        ok = {s: r for s, r in op["responses"].items() if s.startswith("2")}
        assert ok, f"{method.upper()} {path}: no 2xx answer declared"
        for status, response in ok.items():
            if not response.get("content"):
                bodyless.append((method, path))
                continue
            for media, content in response["content"].items():
                schema = content.get("schema")
                assert schema, f"{method.upper()} {path} {status} {media}: empty schema"
                if media == "application/json":
                    ref = schema.get("$ref", "")
                    assert set(schema) == {"$ref"} and ref.startswith("#/components/schemas/"), (path, schema)
                    model = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
                    assert model.get("properties"), f"{method.upper()} {path}: {ref} declares no fields"
    # only forward-auth answers an allowed request without a body
    assert sorted(bodyless) == sorted(DECISION_OPS[1:])
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_every_error_answer_is_the_json_error_body(spec):
    """... except a decision's rejections (403 deny list, 429, 5xx fail-closed: the decision's
    own body, the rejection's error fields included)."""
    for method, path, op in _operations(spec):
        if op.get("parameters") or op.get("requestBody"):
            assert "422" in op["responses"], f"{method.upper()} {path}"
        assert "500" in op["responses"], f"{method.upper()} {path}"
        for status, response in op["responses"].items():
            decision = (method, path) in DECISION_OPS and status in ("403", "429", "500", "503")
            if status[0] in "45" and not decision and path != "/readyz":
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (method, path, status, schema)


def test_the_bearer_scheme_follows_the_access_table(spec):
    assert spec["components"]["securitySchemes"]["bearerAuth"]["type"] == "http"
    assert spec["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"
    seen = set()
    for method, path, op in _operations(spec):
        access = ACCESS[(method.upper(), path)]
        seen.add(access)
        assert op["x-shadowlimit-access"] == access.value
        if access is Access.OPEN:
            assert "security" not in op, path
            continue
        assert {"bearerAuth": []} in op["security"], f"{method.upper()} {path}"
        assert "401" in op["responses"] and "WWW-Authenticate" in op["responses"]["401"]["headers"]
        if access in (Access.OPERATOR, Access.ADMIN):
            assert op["security"] == [{"bearerAuth": []}], path
            assert "403" in op["responses"], path
        else:  # needed or not depending on the configuration: optional
            assert {} in op["security"], path
    assert seen == set(Access)


def test_every_operation_has_an_example_that_matches_its_schema(spec):
    for method, path, op in _operations(spec):
        found = 0
        contents = [(f"request {m}", c) for m, c in op.get("requestBody", {}).get("content", {}).items()]
        contents += [(f"{s} {m}", c) for s, r in op["responses"].items() for m, c in r.get("content", {}).items()]
        for where, content in contents:
            if "example" in content:
                found += 1
                _check(spec, content["schema"], content["example"], f"{method.upper()} {path} {where} example")
        assert found, f"{method.upper()} {path} has no example"


def test_the_decision_endpoints_declare_the_rate_limit_headers(spec):
    for method, path in DECISION_OPS:
        responses = spec["paths"][path][method]["responses"]
        for status in ("200", "429", "403"):
            assert set(responses[status]["headers"]) >= RATE_LIMIT, (method, path, status)
        assert "Retry-After" in responses["429"]["headers"] and "Retry-After" not in responses["200"]["headers"]


def test_the_stream_is_declared_as_server_sent_events(spec):
    responses = spec["paths"]["/v1/stream"]["get"]["responses"]
    assert list(responses["200"]["content"]) == ["text/event-stream"]
    assert "Retry-After" in responses["503"]["headers"]


# -- the document against real answers -------------------------------------------------------


def _declared(spec, method, path, status):
    response = spec["paths"][path][method]["responses"][str(status)]
    return response, response.get("content", {}).get("application/json", {}).get("schema")


def test_real_answers_match_the_declared_schemas(live_cp, spec):
    h = admin_headers()
    with httpx.Client(base_url=live_cp.url, headers=h, timeout=10) as c:
        key = f"k-{uuid.uuid4().hex[:8]}"
        calls = [("post", "/v1/decide", c.post("/v1/decide", json={"route": "search", "key": key}))]
        # login allows 5 per 10 s (sliding window): the 6th is a rejection however slow the machine
        rejected = [c.post("/v1/decide", json={"route": "login", "key": key}) for _ in range(6)][-1]
        calls.append(("post", "/v1/decide", rejected))
        assert rejected.status_code == 429
        batch = {"requests": [{"route": "search", "key": "b"}, {"route": "nope", "key": "b"}]}
        calls.append(("post", "/v1/decide/batch", c.post("/v1/decide/batch", json=batch)))
        calls.append(
            (
                "put",
                "/v1/routes/{route}/mode",
                c.put("/v1/routes/login/mode", json={"mode": "shadow", "reason": "schema"}),
            )
        )
        calls.append(("post", "/ratelimit/reset/{client_id}", c.post(f"/ratelimit/reset/{key}")))
        for path in ("/v1/routes", "/v1/rollout/audit", "/v1/divergence", "/v1/buckets", "/v1/backend", "/v1/external",
                     "/ratelimit/stats", "/ratelimit/clients", "/healthz", "/readyz"):  # fmt: skip
            calls.append(("get", path, c.get(path)))
        calls.append(
            ("put", "/v1/routes/{route}/mode", c.put("/v1/routes/nope/mode", json={"mode": "off", "reason": "x"}))
        )
        calls.append(("get", "/v1/divergence", c.get("/v1/divergence", params={"minutes": 0})))
    statuses = set()
    for method, path, r in calls:
        response, schema = _declared(spec, method, path, r.status_code)
        statuses.add(r.status_code)
        assert schema, f"{method.upper()} {path} {r.status_code}: no JSON schema declared"
        _check(spec, schema, r.json(), f"{method.upper()} {path} {r.status_code}")
    assert statuses >= {200, 429, 404, 422}
    # the models parse them too (the same declarations, from the other side)
    by_path = {path: r.json() for _, path, r in calls if r.status_code == 200}
    assert RoutesList.model_validate(by_path["/v1/routes"]).routes
    # the models describe, they do not filter: fields they leave out still arrive
    rule = by_path["/v1/routes"]["routes"][0]["rule"]
    assert {"overrides", "local_describe", "line"} <= set(rule) and "overrides" not in RuleView.model_fields
    entries = AuditTrail.model_validate(by_path["/v1/rollout/audit"]).entries
    assert [(e.kind, e.route) for e in entries[:2]] == [("reset", "*"), ("mode_change", "login")]
    assert entries[1].from_ and entries[1].to == "shadow"
    assert Readiness.model_validate(by_path["/readyz"]).status == "ready"


def test_real_decisions_send_only_declared_headers(live_cp, spec):
    key = f"h-{uuid.uuid4().hex[:8]}"
    with httpx.Client(base_url=live_cp.url, timeout=10) as c:
        # login allows 5 per 10 s (sliding window): the 6th is a rejection however slow the machine
        answers = [c.post("/v1/decide", json={"route": "login", "key": key}) for _ in range(6)]
        forward = {"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/api/login"}  # keyed by the client IP
        answers += [c.get("/v1/authz", headers=forward) for _ in range(6)][-1:]
    for r in (answers[0], answers[-2], answers[-1]):
        method, path = ("post", "/v1/decide") if r.request.url.path == "/v1/decide" else ("get", "/v1/authz")
        declared = {n.lower() for n in spec["paths"][path][method]["responses"][str(r.status_code)]["headers"]}
        sent = {n for n in r.headers if "ratelimit" in n or n == "retry-after"}
        assert sent >= {n.lower() for n in RATE_LIMIT}, sent
        assert sent <= declared, sent - declared
    assert answers[-2].status_code == 429 and "retry-after" in answers[-2].headers
    assert answers[-1].status_code == 429 and answers[-1].json()["allowed"] is False


def test_real_stream_is_server_sent_events(live_cp):
    with httpx.Client(base_url=live_cp.url, headers=admin_headers(), timeout=10) as c:
        with c.stream("GET", "/v1/stream", params={"interval": 1}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            first = next(r.iter_text())
    assert first.startswith("retry: ")


# -- /docs without the Internet ------------------------------------------------------------

_LINKS = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']|url:\s*'([^']+)'""")
_MEDIA = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_load_everything_from_the_control_plane(live_cp, page):
    with httpx.Client(base_url=live_cp.url, timeout=10) as c:
        r = c.get(page)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        html = r.text
        assert "http://" not in html and "https://" not in html, "the page names another host"
        links = {a or b for a, b in _LINKS.findall(html)}
        assets = {u for u in links if u.startswith("/docs/assets/")}
        assert len(assets) >= 2, links
        for url in links:
            assert url.startswith("/") and not url.startswith("//"), url
        for url in assets:
            got = c.get(url)
            assert got.status_code == 200, url
            assert got.headers["content-type"].startswith(_MEDIA[url[url.rindex(".") :]]), (url, got.headers)
            assert len(got.content) > 1000, url
        assert c.get("/openapi.json").status_code == 200


def test_the_swagger_bundle_reads_openapi_3_1(live_cp, spec):
    """Swagger UI 4 shows a 3.1 document as an error: the bundle served must be 5 or later."""
    assert spec["openapi"].startswith("3.1")
    js = httpx.get(live_cp.url + "/docs/assets/swagger-ui-bundle.js", timeout=10).text
    assert "OpenAPI31" in js or "openapi31" in js.lower()


def test_only_the_docs_files_are_served_from_the_assets_path(live_cp):
    for name in ("nope.js", "..%2Fcore.py", "__init__.py"):
        r = httpx.get(f"{live_cp.url}/docs/assets/{name}", timeout=5)
        assert r.status_code == 404, name
        assert r.json()["error"] == "not_found"
