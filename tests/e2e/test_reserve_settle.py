"""Reserve and settle over HTTP (a decision's ``estimate``, ``POST /v1/settle``, the batch forms,
``GET /v1/reservations``) by two control-plane replicas sharing one budget on real Redis
(standalone and a 3-master cluster): a reservation made on one replica and settled on the other
is charged exactly once, however often and wherever it is settled again; a budget that cannot
cover an estimate refuses it (or, admitting while anything is left, goes into debt); an expired,
unknown, foreign or malformed reservation and a bad cost or estimate are refused naming the
field, and nothing is charged for them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from cp_server import ControlPlaneServer, admin_headers, started, unique_namespace, wait_until, write_rules

from control_plane.model.reservation import ReservationId

pytestmark = pytest.mark.timeout(120)

RULES = """\
routes:
  - name: chat
    match: {path: /v1/chat/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 600, period: 60s, burst: 1000}
    budget: {reservation_ttl: 60s}
  - name: eager
    match: {path: /v1/eager/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 600, period: 60s, burst: 1000}
    budget: {admit: positive, on_expiry: release, reservation_ttl: 60s}
  - name: brief
    match: {path: /v1/brief/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 600, period: 60s, burst: 1000}
    budget: {reservation_ttl: 300ms, on_expiry: release}
  - name: window
    match: {path: /v1/window/**}
    key: {strategy: header, header: X-Tenant}
    local: {algorithm: fixed_window, average: 1000, period: 1h}
    budget: {max_reservations: 2}
  - name: plain
    match: {path: /v1/plain/**}
    key: {strategy: header, header: X-Tenant}
    local: {average: 600, period: 60s, burst: 1000}
"""
BUDGETS = ("chat", "eager", "brief", "window", "plain")


def _fleet(redis_url: str, tmp_path: Any, mode: str) -> Iterator[tuple[Any, Any, ControlPlaneServer]]:
    rules = write_rules(tmp_path, RULES)
    ns = unique_namespace("reserve")
    a = ControlPlaneServer(redis_url=redis_url, rules_path=rules, namespace=ns, instance_id="replica-a")
    b = ControlPlaneServer(redis_url=redis_url, rules_path=rules, namespace=ns, instance_id="replica-b")
    with started(a, b):
        ca, cb = a.client(), b.client()
        for route in BUDGETS:
            r = ca.put(f"/v1/routes/{route}/mode", json={"mode": mode, "reason": "budgets", "force": True},
                       headers=admin_headers())  # fmt: skip
            assert r.status_code == 200, r.text
            wait_until(lambda route=route: _mode(cb, route) == mode, 3.0, 0.02, f"replica b has {route} in {mode}")
        yield ca, cb, a
        ca.close()
        cb.close()


@pytest.fixture
def enforced(any_redis_url, tmp_path):
    yield from _fleet(any_redis_url, tmp_path, "enforce")


@pytest.fixture
def shadowed(redis_url, tmp_path):
    yield from _fleet(redis_url, tmp_path, "shadow")


def _mode(client: Any, route: str) -> str:
    return next(r["mode"] for r in client.get("/v1/routes").json()["routes"] if r["name"] == route)


def _left(client: Any, route: str, key: str) -> int:
    """What is left of the key's budget, as the side that counts says (a charge of 0 spends nothing)."""
    r = client.post("/v1/charge", json={"route": route, "key": key, "cost": 0})
    assert r.status_code == 200, r.text
    return int(r.json()["remaining"])


def _reserve(client: Any, route: str, key: str, estimate: int) -> Any:
    return client.post("/v1/decide", json={"route": route, "key": key, "estimate": estimate})


def test_a_reservation_on_one_replica_settled_on_the_other_is_charged_once(enforced) -> None:
    ca, cb, _ = enforced
    r = _reserve(ca, "chat", "acme", 600)
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["estimate"], body["enforced_by"], body["distributed"]["remaining"]) == (600, "distributed", 400)
    rid = ReservationId.decode(body["reservation"])
    assert (rid.route, rid.key, rid.store) == ("chat", "acme", "booked")
    assert 400 <= _left(cb, "chat", "acme") <= 420  # the reservation holds its estimate (10 a second refill)

    first = cb.post("/v1/settle", json={"reservation": body["reservation"], "cost": 250})
    assert first.status_code == 200, first.text
    f = first.json()
    assert (f["status"], f["estimate"], f["cost"], f["enforced_by"]) == ("settled", 600, 250, "distributed")
    assert 750 <= f["remaining"] <= 770 and f["over"] is False  # 350 refunded
    assert f["local"]["status"] == "unknown"  # replica b's local limiter never held it
    # settled again, on either replica, with any cost: the first answer, nothing charged
    for client in (ca, cb, ca):
        again = client.post("/v1/settle", json={"reservation": body["reservation"], "cost": 999})
        assert again.status_code == 200, again.text
        g = again.json()
        assert (g["status"], g["cost"], g["remaining"]) == ("again", 250, f["remaining"])
    assert _left(ca, "chat", "acme") <= 790  # charged once: 1000 - 250 plus what refilled meanwhile
    # the key's reservations, as each store holds them
    seen = ca.get("/v1/reservations", params={"route": "chat", "key": "acme"}).json()
    assert seen["distributed"]["settled"] == 1 and seen["distributed"]["outstanding"] == 0
    assert seen["local"]["outstanding"] == 0 and seen["local"]["settled"] == 1  # a settled it locally, again
    assert seen["max_reservations"] == 1000 and "rsv1." not in str(seen)


def test_cover_refuses_what_is_not_left_and_positive_goes_into_debt(enforced) -> None:
    ca, cb, _ = enforced
    assert _reserve(ca, "chat", "t1", 900).status_code == 200
    refused = _reserve(cb, "chat", "t1", 300)
    assert refused.status_code == 429, refused.text
    assert refused.json()["reservation"] is None and refused.headers["Retry-After"]
    # positive: admitted while anything is left, the estimate taken into debt
    assert _reserve(ca, "eager", "t1", 900).status_code == 200
    deep = _reserve(cb, "eager", "t1", 300)
    assert deep.status_code == 200 and deep.json()["distributed"]["remaining"] < 0, deep.text
    assert _reserve(ca, "eager", "t1", 1).status_code == 429  # nothing left now
    settled = cb.post("/v1/settle", json={"reservation": deep.json()["reservation"], "cost": 0}).json()
    assert settled["remaining"] >= 100  # all 300 given back


def test_a_key_holds_at_most_max_reservations(enforced) -> None:
    ca, _, _ = enforced
    ids = [_reserve(ca, "window", "t1", 10).json()["reservation"] for _ in range(2)]
    full = _reserve(ca, "window", "t1", 10)
    assert full.status_code == 429 and full.json()["reservation"] is None
    assert full.json()["distributed"]["remaining"] == 980  # refused for the bound: nothing taken
    # settling does not free a place (a settled one is remembered, so a repeat gets its answer)
    assert ca.post("/v1/settle", json={"reservation": ids[0], "cost": 4}).json()["remaining"] == 986
    assert _reserve(ca, "window", "t1", 10).status_code == 429


def test_an_expired_reservation_is_a_409_saying_what_became_of_it(enforced) -> None:
    ca, cb, _ = enforced
    r = _reserve(ca, "brief", "t1", 500).json()
    assert r["distributed"]["remaining"] == 500
    time.sleep(0.35)  # past its 300 ms TTL
    late = cb.post("/v1/settle", json={"reservation": r["reservation"], "cost": 100})
    assert late.status_code == 409, late.text
    e = late.json()
    assert (e["error"], e["field"]) == ("reservation_expired", "reservation")
    assert (e["expired"], e["estimate"]) == ("released", 500)
    assert _left(ca, "brief", "t1") >= 1000 - 1  # released: given back, the late settle charged nothing


@pytest.mark.parametrize(
    ("path", "body", "status", "field", "says"),
    [
        ("/v1/settle", {"reservation": "nope", "cost": 5}, 422, "reservation", "not a reservation id"),
        ("/v1/settle", {"reservation": "rsv1.!!!", "cost": 5}, 422, "reservation", "not base64url"),
        ("/v1/settle", {"reservation": "", "cost": 5}, 422, "reservation", "at least 1 character"),
        ("/v1/settle", {"cost": 5}, 422, "reservation", "Field required"),
        ("/v1/settle", {"reservation": "@id", "cost": -1}, 422, "cost", "greater than or equal to 0"),
        ("/v1/settle", {"reservation": "@id", "cost": 2.5}, 422, "cost", "integer"),
        ("/v1/settle", {"reservation": "@id", "cost": 10**9 + 1}, 422, "cost", "less than or equal to 1000000000"),
        ("/v1/settle", {"reservation": "@foreign", "cost": 5}, 422, "reservation", "namespace 'elsewhere'"),
        ("/v1/settle", {"reservation": "@unknown", "cost": 5}, 404, "reservation", "no reservation by that id"),
        ("/v1/settle", {"reservation": "@gone-route", "cost": 5}, 404, "route", "no route named 'gone'"),
        ("/v1/decide", {"route": "chat", "key": "t1", "estimate": 0}, 422, "estimate", "greater than or equal to 1"),
        ("/v1/decide", {"route": "chat", "key": "t1", "estimate": 1.5}, 422, "estimate", "integer"),
        ("/v1/decide", {"route": "chat", "key": "t1", "estimate": 10**9 + 1}, 422, "estimate", "less than or equal"),
        ("/v1/decide", {"route": "chat", "key": "t1", "estimate": 1001}, 422, "estimate", "could never be allowed"),
        ("/v1/decide", {"route": "plain", "key": "t1", "estimate": 5}, 422, "estimate", "keeps no reservations"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_nothing_is_charged(enforced, path, body, status, field, says):
    ca, _, server = enforced
    held = _reserve(ca, "chat", "t1", 100).json()["reservation"]
    rid = ReservationId.decode(held)
    made = {
        "@id": held,
        "@foreign": ReservationId(namespace="elsewhere", route="chat", key="t1", store="booked", nonce=rid.nonce),
        "@unknown": ReservationId(namespace=server.namespace, route="chat", key="t1", store="booked", nonce="A" * 22),
        "@gone-route": ReservationId(
            namespace=server.namespace, route="gone", key="t1", store="booked", nonce=rid.nonce
        ),
    }  # fmt: skip
    if str(body.get("reservation", "")).startswith("@"):
        v = made[body["reservation"]]
        body = {**body, "reservation": v if isinstance(v, str) else v.encode()}
    before = _left(ca, "chat", "t1")
    r = ca.post(path, json=body)
    assert r.status_code == status and r.json()["field"] == field and says in r.json()["message"], r.text
    assert _left(ca, "chat", "t1") >= before  # (a refill may have added meanwhile; nothing was taken)
    assert ca.post("/v1/settle", json={"reservation": held, "cost": 100}).json()["status"] == "settled"


def test_batches_reserve_and_settle_in_place(enforced) -> None:
    ca, cb, _ = enforced
    got = ca.post("/v1/decide/batch", json={"requests": [
        {"route": "chat", "key": "b1", "estimate": 300},
        {"route": "chat", "key": "b1"},
        {"route": "plain", "key": "b1", "estimate": 3},
        {"route": "chat", "key": "b2", "estimate": 50},
    ]})  # fmt: skip
    assert got.status_code == 200, got.text
    first, plain, bad, other = got.json()["decisions"]
    assert first["reservation"] and first["estimate"] == 300
    assert plain["allowed"] and "reservation" not in plain
    assert (bad["status"], bad["field"], bad["index"]) == (422, "estimate", 2)
    assert other["reservation"] and other["distributed"]["remaining"] == 950
    settled = cb.post("/v1/settle/batch", json={"settles": [
        {"reservation": first["reservation"], "cost": 100},
        {"reservation": "nope", "cost": 1},
        {"reservation": other["reservation"], "cost": 50},
        {"reservation": first["reservation"], "cost": 7},
    ]}).json()["settles"]  # fmt: skip
    assert [s.get("status") for s in settled] == ["settled", 422, "settled", "again"] or [
        s.get("status") for s in settled
    ] == ["again", 422, "settled", "settled"]  # the two settles of one reservation race: one settles
    assert {s.get("cost") for s in (settled[0], settled[3])} == {100}
    assert settled[2]["remaining"] == 950


def test_in_shadow_the_local_answer_counts_and_redis_is_settled_beside_it(shadowed) -> None:
    ca, cb, _ = shadowed
    r = _reserve(ca, "chat", "s1", 700).json()
    assert (r["enforced_by"], r["local"]["remaining"], r["distributed"]["remaining"]) == ("local", 300, 300)
    assert ReservationId.decode(r["reservation"]).store == "booked"
    # settled where it was made: the local answer counts, Redis settled too
    here = ca.post("/v1/settle", json={"reservation": r["reservation"], "cost": 200}).json()
    sides = (here["local"]["status"], here["distributed"]["status"])
    assert here["enforced_by"] == "local" and sides == ("settled", "settled")
    assert 800 <= here["remaining"] <= 820
    # a second reservation settled on the other replica: its local limiter never held it, Redis answers
    r2 = _reserve(ca, "chat", "s1", 100).json()
    there = cb.post("/v1/settle", json={"reservation": r2["reservation"], "cost": 40}).json()
    assert (there["enforced_by"], there["local"]["status"], there["status"]) == ("distributed", "unknown", "settled")
    metrics = ca.get("/metrics").text
    assert 'rate_limit_reservations_total{result="reserved",route="chat"} 2.0' in metrics
    assert 'rate_limit_settles_total{result="settled",route="chat"} 1.0' in metrics
    assert 'rate_limit_refunded_units_total{route="chat"} 500.0' in metrics  # 700 reserved, 200 used


def test_with_redis_down_an_enforced_settle_is_a_503_and_a_reservation_made_meanwhile_is_charged_after(
    tmp_path,
) -> None:
    """Redis killed under an enforced budget: a settle cannot be made where it counts (503,
    nothing settled there; a retry is safe); a reservation the failure policy admitted meanwhile
    is booked nowhere in Redis, and its settle, Redis back, charges the actual cost there in
    full, once."""
    from limiter.embedded import EmbeddedRedis

    redis = EmbeddedRedis().start()
    server = ControlPlaneServer(
        redis_url=redis.url, rules_path=write_rules(tmp_path, RULES), failure_policy="passThrough",
        redis_command_timeout_s=0.2, auto_rollback_after_s=600,
    )  # fmt: skip
    try:
        with started(server):
            c = server.client()
            r = c.put("/v1/routes/chat/mode", json={"mode": "enforce", "reason": "t", "force": True},
                      headers=admin_headers())  # fmt: skip
            assert r.status_code == 200, r.text
            made = _reserve(c, "chat", "k", 600).json()["reservation"]
            redis.kill()
            down = c.post("/v1/settle", json={"reservation": made, "cost": 100})
            assert down.status_code == 503, down.text
            assert (down.json()["error"], down.json()["field"]) == ("backend_unavailable", "reservation")
            meanwhile = _reserve(c, "chat", "k", 300)
            m = meanwhile.json()
            assert meanwhile.status_code == 200 and m["enforced_by"] == "failure_policy", meanwhile.text
            assert ReservationId.decode(m["reservation"]).store == "unasked"
            redis.start()  # on the same address, and empty (a crash; nothing was saved): what it held is gone

            def settled() -> Any:
                s = c.post("/v1/settle", json={"reservation": m["reservation"], "cost": 250})
                return s.json() if s.status_code == 200 else None

            after = wait_until(settled, 15.0, 0.1, "the settle goes through once Redis is back")
            assert (after["status"], after["enforced_by"]) == ("settled", "distributed")
            assert after["distributed"]["status"] == "settled" and 750 <= after["remaining"] <= 760  # all 250
            again = c.post("/v1/settle", json={"reservation": m["reservation"], "cost": 250}).json()
            assert again["status"] == "again" and again["remaining"] == after["remaining"]
            # the first one, retried: Redis lost it with its data; this replica's local limiter answers
            retried = c.post("/v1/settle", json={"reservation": made, "cost": 100}).json()
            assert (retried["status"], retried["enforced_by"]) == ("again", "local")
            c.close()
    finally:
        redis.stop()
