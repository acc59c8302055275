"""The API's edges say the same thing everywhere, family by family (decide, rollout, admin,
what-if): one strictness for every JSON body (``/v1/decide``'s: ``"5"``, ``5.0`` and ``true``
are not integers, ``"5"``, ``true`` and ``NaN`` not numbers), one answer to a body that is
not JSON (422 ``invalid_request`` naming ``body``: nested too deep, not UTF-8, cut short),
one set of bounds for keys (``validate_key``'s, 256 bytes: a decision's key, a batch item's,
an adjustment's, a reset's id), each refusal the JSON error body naming the field; nothing
refused is written. A real control plane on loopback, real Redis.

(The refusals before the app, a request line too long or not HTTP at all, are in
``test_request_limits.py``.)
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from cp_server import ControlPlaneServer, admin_headers, write_rules

ADMIN = admin_headers()

#: every endpoint that reads a JSON body: (family, method, path, a valid body)
BODIES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("decide", "POST", "/v1/decide", {"route": "search", "key": "k"}),
    ("decide", "POST", "/v1/decide/batch", {"requests": [{"route": "search", "key": "k"}]}),
    ("rollout", "PUT", "/v1/routes/search/mode", {"mode": "shadow", "reason": "r"}),
    ("admin", "PUT", "/ratelimit/config", {"route": "search", "average": 5, "reason": "r"}),
    ("whatif", "POST", "/v1/whatif", {"route": "search", "policy": {"average": 5}}),
    ("whatif", "POST", "/v1/whatif/suggest", {"route": "search", "max_reject_share": 0.01}),
]

#: (path, field (dotted), kind): the typed fields of each body
FIELDS: list[tuple[str, str, str]] = [
    ("/v1/decide", "cost", "int"),
    ("/v1/decide/batch", "requests.0.cost", "int"),
    ("/v1/routes/search/mode", "canary_percent", "int"),
    ("/v1/routes/search/mode", "force", "bool"),
    ("/ratelimit/config", "burst", "int"),
    ("/ratelimit/config", "average", "float"),
    ("/ratelimit/config", "clear", "bool"),
    ("/v1/whatif", "minutes", "int"),
    ("/v1/whatif", "policy.burst", "int"),
    ("/v1/whatif", "policy.average", "float"),
    ("/v1/whatif", "policy.period", "float"),
    ("/v1/whatif/suggest", "minutes", "int"),
    ("/v1/whatif/suggest", "max_reject_share", "float"),
]

#: values that are not of the kind, strictly (what a lax parser would coerce)
WRONG = {"int": ["5", True, 5.0], "float": ["0.5", True, float("nan"), float("inf")], "bool": ["true", 1]}


@pytest.fixture(scope="module")
def cp(redis_server, tmp_path_factory):
    with ControlPlaneServer(redis_url=redis_server.url, rules_path=write_rules(tmp_path_factory.mktemp("edges"))) as s:
        yield s


@pytest.fixture(scope="module")
def http(cp):
    with cp.client(headers=ADMIN) as c:
        yield c


def _endpoint(path: str) -> tuple[str, str, dict[str, Any]]:
    return next((m, p, body) for _, m, p, body in BODIES if p == path)


def _with(body: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """``body`` (a copy) with the dotted ``field`` set to ``value``."""
    out = json.loads(json.dumps(body))
    *parents, last = field.split(".")
    node: Any = out
    for p in parents:
        node = node[int(p)] if p.isdigit() else node[p]
    node[last] = value
    return out


def _refused(r: Any, status: int, error: str, field: str) -> dict[str, Any]:
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["error"] == error and body["field"] == field and body["message"], body
    return body


def _audit_len(http: Any) -> int:
    return len(http.get("/v1/rollout/audit", params={"limit": 1000}).json()["entries"])


# --------------------------------------------------------------------------- one strictness


@pytest.mark.parametrize(("path", "field", "kind", "value"), [(p, f, k, v) for p, f, k in FIELDS for v in WRONG[k]])
def test_one_strictness_for_every_json_body(http, path, field, kind, value):
    method, path, body = _endpoint(path)
    # Python's json writes NaN and Infinity as JSON does not: a lax parser would take them
    r = http.request(
        method, path, content=json.dumps(_with(body, field, value)), headers={"content-type": "application/json"}
    )
    out = _refused(r, 422, "invalid_request", field)
    assert out["errors"][0]["field"] == field


@pytest.mark.parametrize(
    ("method", "path", "body"), [(m, p, b) for _, m, p, b in BODIES], ids=[p for *_, p, _ in BODIES]
)
def test_every_valid_body_passes_the_same_parser(http, method, path, body):
    """The bodies above are valid: what refuses the wrong values is the type, nothing else
    (the what-if endpoints then find no recording: 404, after the body was read)."""
    r = http.request(method, path, json=body)
    assert r.status_code in (200, 404), r.text
    if r.status_code == 404:
        assert path.startswith("/v1/whatif") and r.json()["error"] == "no_recording"


# --------------------------------------------------------------------------- one answer to non-JSON

NOT_JSON = {
    "nested too deep": b'{"route": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    "a deep array": b"[" * 100_000 + b"]" * 100_000,
    "not UTF-8": b'{"route": "\xff\xfe"}',
    "cut short": b'{"route": "search", ',
    "empty": b"",
}


@pytest.mark.parametrize("payload", list(NOT_JSON), ids=list(NOT_JSON))
@pytest.mark.parametrize(("method", "path"), [(m, p) for _, m, p, _ in BODIES], ids=[p for *_, p, _ in BODIES])
def test_one_answer_to_a_body_that_is_not_json(http, method, path, payload):
    before = _audit_len(http)
    r = http.request(method, path, content=NOT_JSON[payload], headers={"content-type": "application/json"})
    out = _refused(r, 422, "invalid_request", "body")
    assert out["message"].startswith("body: ") and out["errors"] == [{"field": "body", "message": out["message"][6:]}]
    assert _audit_len(http) == before


def test_a_body_of_another_shape_is_named_as_the_body(http):
    for _, method, path, _ in BODIES:
        _refused(http.request(method, path, json=[1, 2]), 422, "invalid_request", "body")


# --------------------------------------------------------------------------- one set of bounds for keys


def _decide(http: Any, key: str) -> tuple[int, dict[str, Any]]:
    r = http.post("/v1/decide", json={"route": "search", "key": key})
    return r.status_code, r.json()


def _batch(http: Any, key: str) -> tuple[int, dict[str, Any]]:
    r = http.post("/v1/decide/batch", json={"requests": [{"route": "search", "key": key}]})
    if r.status_code == 200:  # a refused item: its error in its place, with the status /v1/decide gives
        item = r.json()["decisions"][0]
        return item.get("status", 200), {**item, "field": item.get("field")}
    body = r.json()
    return r.status_code, {**body, "field": body["field"].removeprefix("requests.0.")}


def _adjust(http: Any, key: str) -> tuple[int, dict[str, Any]]:
    r = http.put("/ratelimit/config", json={"route": "search", "key": key, "average": 5, "reason": "bounds"})
    return r.status_code, r.json()


def _reset(http: Any, key: str) -> tuple[int, dict[str, Any]]:
    r = http.post(f"/ratelimit/reset/{quote(key, safe='')}", params={"route": "search"})
    body = r.json()
    return r.status_code, {**body, "field": "key" if body.get("field") == "client_id" else body.get("field")}


KEY_SITES = {"decide": _decide, "batch": _batch, "adjust": _adjust, "reset": _reset}
TOO_LONG = ["k" * 257, "x" * 10_000, "é" * 129]  # 258 bytes of UTF-8
NOT_KEYS = [" lead", "trail ", "tab\tkey", "new\nline", "zero\u200bwidth"]


@pytest.mark.parametrize("site", list(KEY_SITES))
def test_one_set_of_bounds_for_keys(cp, http, site):
    submit = KEY_SITES[site]
    for good in ("k" * 256, "é" * 128, "tenant:acme/users 7"):
        status, body = submit(http, good)
        assert status == 200, (site, good, body)
    audit = _audit_len(http)
    for bad in TOO_LONG + NOT_KEYS:
        status, body = submit(http, bad)
        assert status == 422, (site, bad, body)
        assert body["field"] == "key" and body["error"] in ("invalid_key", "invalid_request"), (site, bad, body)
        if bad in NOT_KEYS or len(bad) <= 256:  # the content: the same check, the same words everywhere
            assert body["error"] == "invalid_key"
            assert body["message"].split(": ", 1)[1] == _decide(http, bad)[1]["message"].split(": ", 1)[1]
    assert _audit_len(http) == audit  # no refused key reached the audit trail
    assert all(len(a["key"] or "") <= 256 for a in http.get("/ratelimit/stats").json()["adjustments"])


def test_a_reset_names_its_path_parameter_and_asks_for_a_token_first(cp, http):
    _refused(http.post(f"/ratelimit/reset/{'x' * 10_000}"), 422, "invalid_request", "client_id")
    _refused(http.post("/ratelimit/reset/tab%09key"), 422, "invalid_key", "client_id")
    _refused(http.post("/ratelimit/reset/a/b%0Ac"), 422, "invalid_key", "client_id")  # "/" and a line break
    with cp.client() as anonymous:  # the auth gate matches such a path as the route does
        for path in ("/ratelimit/reset/a/b%0Ac", f"/ratelimit/reset/{'x' * 10_000}"):
            r = anonymous.post(path)
            assert r.status_code == 401 and r.json()["error"] == "unauthorized", r.text
