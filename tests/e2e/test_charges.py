"""Charges over HTTP (``POST /v1/charge``, ``/v1/charge/batch``): a cost known only after the
answer, counted whatever is left, by two control-plane replicas sharing one budget on real Redis
(standalone and a 3-master cluster). A charge past the budget lands (a debt on a token bucket)
and both replicas refuse until the refill has repaid it; a charge is never refused for the
budget's sake, only for what is wrong with it (a 422 naming the field)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cp_server import ControlPlaneServer, admin_headers, started, unique_namespace, wait_until, write_rules

pytestmark = pytest.mark.timeout(120)

RULES = """\
routes:
  - name: tokens
    match: {path: /v1/chat/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 600, period: 60s, burst: 1000}
    distributed: {average: 600, period: 60s, burst: 1000}
  - name: window
    match: {path: /v1/window/**}
    key: {strategy: header, header: X-Tenant}
    local: {algorithm: fixed_window, average: 1000, period: 1h}
    distributed: {average: 1000}
  - name: logged
    match: {path: /v1/logged/**}
    key: {strategy: header, header: X-Tenant}
    local: {algorithm: sliding_log, average: 10, period: 60s}
    distributed: {average: 10}
  - name: logged-globally   # the local bucket takes charges; the global sliding log does not
    match: {path: /v1/logged-globally/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 10, period: 60s}
    distributed: {algorithm: sliding_log, average: 10, period: 60s}
"""


@pytest.fixture
def fleet(any_redis_url, tmp_path):
    rules = write_rules(tmp_path, RULES)
    ns = unique_namespace("charges")
    a = ControlPlaneServer(redis_url=any_redis_url, rules_path=rules, namespace=ns, instance_id="replica-a")
    b = ControlPlaneServer(redis_url=any_redis_url, rules_path=rules, namespace=ns, instance_id="replica-b")
    with started(a, b):
        yield from _enforced(a, b)


def _enforced(a: ControlPlaneServer, b: ControlPlaneServer) -> Iterator[tuple[Any, Any]]:
    """Both routes with budgets in enforce, seen by both replicas; the replicas' clients."""
    ca, cb = a.client(), b.client()
    for route in ("tokens", "window"):
        r = ca.put(f"/v1/routes/{route}/mode", json={"mode": "enforce", "reason": "budgets", "force": True},
                   headers=admin_headers())  # fmt: skip
        assert r.status_code == 200, r.text
        wait_until(lambda route=route: _mode(cb, route) == "enforce", 3.0, 0.02, f"replica b has {route} in enforce")
    yield ca, cb
    ca.close()
    cb.close()


def _mode(client, route: str) -> str:
    return next(r["mode"] for r in client.get("/v1/routes").json()["routes"] if r["name"] == route)


def test_two_replicas_charge_one_budget_into_debt_and_both_refuse_until_it_is_repaid(fleet) -> None:
    ca, cb = fleet
    first = ca.post("/v1/charge", json={"route": "tokens", "key": "acme", "cost": 900})
    assert first.status_code == 200, first.text
    f = first.json()
    assert (f["over"], f["remaining"], f["enforced_by"], f["mode"]) == (False, 100, "distributed", "enforce")
    second = cb.post("/v1/charge", json={"route": "tokens", "key": "acme", "cost": 450})
    s = second.json()
    assert second.status_code == 200 and s["over"] is True  # charged all the same: never refused
    assert -351 <= s["remaining"] <= -349 and s["distributed"]["remaining"] == s["remaining"]  # 10 a second refills
    assert s["retry_after_us"] > 30_000_000  # ~351 tokens at 10 a second before one is left
    # both replicas refuse a request now: the shared bucket is in debt
    for c in (ca, cb):
        d = c.post("/v1/decide", json={"route": "tokens", "key": "acme"})
        assert d.status_code == 429 and d.json()["distributed"]["remaining"] < 0, d.text
        assert d.headers["X-RateLimit-Remaining"] == "0" and ";r=0;" in d.headers["RateLimit"]  # never a debt
    # another tenant's budget is its own
    assert cb.post("/v1/decide", json={"route": "tokens", "key": "globex"}).status_code == 200


def test_a_window_counts_charges_past_its_limit_until_it_ends(fleet) -> None:
    ca, cb = fleet
    got = ca.post("/v1/charge/batch", json={"charges": [
        {"route": "window", "key": "t1", "cost": 700},
        {"route": "window", "key": "t1", "cost": 500},
        {"route": "nope", "key": "t1", "cost": 5},
        {"route": "window", "key": "t2", "cost": 10},
    ]})  # fmt: skip
    assert got.status_code == 200, got.text
    one, two, bad, other = got.json()["charges"]
    assert (one["over"], one["remaining"]) == (False, 300)
    assert (two["over"], two["remaining"]) == (True, -200)  # counted past the limit, in the window
    assert (bad["status"], bad["field"], bad["index"]) == (404, "route", 2)
    assert (other["over"], other["remaining"]) == (False, 990)
    assert cb.post("/v1/decide", json={"route": "window", "key": "t1"}).status_code == 429


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"route": "tokens", "key": "acme", "cost": -5}, "cost", "greater than or equal to 0"),
        ({"route": "tokens", "key": "acme", "cost": 2.5}, "cost", "integer"),
        ({"route": "tokens", "key": "acme", "cost": 10**9 + 1}, "cost", "less than or equal to 1000000000"),
        ({"route": "tokens", "key": "acme"}, "cost", "Field required"),
        ({"route": "tokens", "key": "acme", "cost": "9"}, "cost", "integer"),
        ({"route": "logged", "key": "acme", "cost": 3}, "cost", "sliding_log keeps one entry per unit"),
        ({"route": "logged-globally", "key": "acme", "cost": 3}, "cost", "sliding_log keeps one entry per unit"),
        ({"route": "tokens", "key": "", "cost": 3}, "key", "at least 1 character"),
    ],
)
def test_a_bad_charge_is_a_422_naming_the_field_and_nothing_is_charged(fleet, body, field, says) -> None:
    ca, _ = fleet
    before = ca.post("/v1/charge", json={"route": "tokens", "key": "acme", "cost": 0}).json()["remaining"]
    r = ca.post("/v1/charge", json=body)
    assert r.status_code == 422 and r.json()["field"] == field and says in r.json()["message"], r.text
    after = ca.post("/v1/charge", json={"route": "tokens", "key": "acme", "cost": 0}).json()["remaining"]
    assert after >= before  # (a refill may have added meanwhile; nothing was taken)
