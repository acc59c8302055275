"""What-if over a budget route's recording (control_plane/whatif): charges, reserves and settles
written and read back as they were, and replayed through the limiter's own reservation model."""

from __future__ import annotations

from control_plane.whatif.recorder import _cost_of, _cost_text, _decode, _encode
from control_plane.whatif.replay import Booked, replay, replay_budget
from limiter import Policy
from limiter.policy import Charge
from limiter.reservations import Book, Terms, reserve, settle

T0 = 1_700_000_000_000_000


def test_costs_are_written_and_read_back_as_they_were():
    for cost in (1, 7, Charge(1200), Booked(kind="r", amount=1050, tag="abc123DEF_-x"), Booked("s", 912, "t")):
        back = _cost_of(_cost_text(cost))
        assert back == cost and back.__class__ is cost.__class__
    keys = {("acme", 1.0): [1.0, [T0, T0 + 5], [Booked("r", 100, "n1"), Booked("s", 80, "n1")], ["s", "?"], ["1", "1"]]}
    got: dict = {}
    assert _decode(_encode(keys), got) == 2
    assert got == {"acme": [(T0, Booked("r", 100, "n1"), 1.0), (T0 + 5, Booked("s", 80, "n1"), 1.0)]}


def test_a_budget_replay_is_the_reservation_model_in_time_order():
    policy = Policy(average=500, period=3600.0, burst=500)
    terms = Terms(ttl_us=60_000_000)
    events = []
    for i in range(8):  # reserve 100, settle 140 a second later, every 2 s
        events += [
            (T0 + 2_000_000 * i, Booked("r", 100, f"n{i}"), 1.0),
            (T0 + 2_000_000 * i + 1_000_000, Booked("s", 140, f"n{i}"), 1.0),
        ]
    events.append((T0 + 20_000_000, Charge(300), 1.0))
    events.append((T0 + 21_000_000, 50, 1.0))
    got = replay_budget({"acme": events}, policy, terms)
    state, book, refused, held = None, Book.empty(), 0, 0
    for ts, cost, _ in events:
        if cost.__class__ is Booked and cost.kind == "r":
            out, state, book = reserve(state, book, ts, policy, estimate=cost.amount, rid=cost.tag, terms=terms)
            refused += not out.reserved
            held += 0 if out.reserved else cost.amount
        elif cost.__class__ is Booked:
            _, state, book = settle(state, book, ts, policy, rid=cost.tag, actual=cost.amount, terms=terms)
    assert refused == 5 and held == 500  # 500 - 140 x 3 = 80 left: the fourth and later are refused
    assert (got.requests, got.rejections) == (10, refused + 1)  # the request of 50 after a charge into debt
    assert got.top_keys[0].units == held + 50
    # a plain replay reads the same recording as requests: each reserve one of its estimate, no settle
    plain = replay({"acme": events}, policy)
    assert plain.requests == 10 and plain.events == len(events)


def test_a_plain_replay_on_a_sliding_log_takes_a_charge_as_a_request_of_its_cost():
    log = Policy(average=3, period=60.0, algorithm="sliding_log")
    events = [(T0, Charge(2), 1.0), (T0 + 1, 1, 1.0), (T0 + 2, 1, 1.0)]
    got = replay({"acme": events}, log)
    assert (got.requests, got.rejections) == (3, 1)


def test_the_outstanding_scan_sums_each_routes_open_reservations_a_slice_at_a_time():
    from control_plane.observe.budgets import OutstandingScan
    from control_plane.observe.metrics import Metrics
    from limiter import LocalLimiter

    local, metrics = LocalLimiter(), Metrics()
    policy, terms = Policy(average=10_000, period=3600.0, burst=10_000), Terms(ttl_us=60_000_000)
    for i in range(30):  # 30 keys of chat, 3 reservations each; the first of each settled
        for j in range(3):
            local.reserve(f"chat:k{i}", policy, 10 + j, rid=f"r{j}", terms=terms, now_us=T0)
        local.settle(f"chat:k{i}", policy, 5, rid="r0", terms=terms, now_us=T0)
    local.reserve("other:k", policy, 7, rid="x", terms=terms, now_us=T0)
    local.reserve("chat:late", policy, 99, rid="y", terms=terms, now_us=T0 - 120_000_000)  # expired by now
    local.check("chat:spender", policy, Charge(10_300), T0)  # 300 into debt, no reservation
    local.check("plain:k", policy, 1, T0)  # not a budget route: not read
    scan = OutstandingScan(local, metrics, per_step=20)  # about 5 books a step: a pass takes several
    steps = 0
    routes = {"chat": policy, "other": policy, "quiet": policy}
    while scan.passes == 0:
        scan.step(T0, lambda: routes)
        steps += 1
    assert steps > 3
    idle = OutstandingScan(local, Metrics())
    idle.step(T0, dict)  # no budget route: nothing listed, nothing set
    assert idle._keys == [] and idle.passes == 0
    assert metrics.outstanding.samples() == {("chat",): 60, ("other",): 1, ("quiet",): 0}
    assert metrics.reserved_units.samples() == {("chat",): 30 * (11 + 12), ("other",): 7, ("quiet",): 0}
    assert metrics.debt_units.samples() == {("chat",): 300.0, ("other",): 0.0, ("quiet",): 0.0}


def test_a_plain_replay_counts_charges_refused_or_not_as_envoy_counts_hits():
    """Envoy's hits are charges: each counted whatever is left, over the limit when it did not fit."""
    window = Policy(average=3, period=60.0, algorithm="fixed_window")
    got = replay({"envoy": [(T0 + i, Charge(1), 1.0) for i in range(5)]}, window)
    assert (got.requests, got.rejections) == (5, 2)
