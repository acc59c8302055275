"""The labelled counters exist at 0 for every label set known in advance (so the first event is
an increase Prometheus sees), and the latency buckets resolve in-process decisions."""

from __future__ import annotations

from cp_server import metric_value
from promql import exported_names

from control_plane.model.rollout import Divergence, Mode
from control_plane.observe.metrics import DECISION_ENFORCERS, Metrics


def _samples(m: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for fam in m.registry.collect()
        for s in fam.samples
        if not s.name.endswith("_created")
    }


def _has(samples, name: str, value: float = 0.0, **labels: str) -> bool:
    return samples.get((name, frozenset(labels.items()))) == value


def _dc(labels: frozenset[tuple[str, str]]) -> tuple[str, str]:
    d = dict(labels)
    return d["direction"], d["cause"]


def test_a_fresh_registry_has_the_fixed_label_sets_at_0():
    s = _samples(Metrics())
    for reason in ("local_exhausted", "distributed_exhausted", "backend_error", "fallback_exhausted", "deny_list"):
        assert _has(s, "rate_limit_rejections_total", reason=reason)
    for policy in ("passThrough", "failClosed", "inMemoryFallback"):
        assert _has(s, "rate_limit_fallback_decisions_total", policy=policy)
    for to in ("closed", "open", "half_open"):
        assert _has(s, "rate_limit_breaker_transitions_total", to=to)
        assert _has(s, "rate_limit_external_breaker_transitions_total", to=to)
    for result in ("ok", "error"):
        assert _has(s, "rate_limit_rules_reload_total", result=result)
    for code in ("ok", "over_limit", "invalid", "error"):
        assert _has(s, "rate_limit_envoy_requests_total", code=code)
    for t in ("local", "distributed"):
        for status in ("allowed", "denied"):
            assert _has(s, "rate_limit_requests_total", limiter_type=t, status=status)
    for mode in ("off", "shadow", "canary", "enforce", "batch"):
        assert _has(s, "rate_limit_decision_duration_seconds_count", mode=mode)
    assert _has(s, "rate_limit_breaker_state", 1.0, state="closed")
    assert _has(s, "rate_limit_rules_valid", 1.0)
    assert _has(s, "rate_limit_clock_skew_seconds", 0.0)
    # nothing about a route before the route is known
    assert not [k for k in s if ("route", "search") in k[1]]


def test_add_route_creates_every_route_series_at_0_once():
    m = Metrics()
    m.add_route("search")
    s = _samples(m)
    for mode in Mode:
        for automatic in ("true", "false"):
            assert _has(s, "rate_limit_mode_changes_total", route="search", to=mode.value, automatic=automatic)
        for by in DECISION_ENFORCERS[mode.value]:
            for allowed in ("true", "false"):
                assert _has(
                    s, "rate_limit_decisions_total", route="search", mode=mode.value, enforced_by=by, allowed=allowed
                )
    for div in Divergence:
        assert _has(s, "rate_limit_shadow_divergence_total", route="search", direction=div.value)
    forward, reverse = Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY.value, Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW.value
    causes = {(d, c) for n, labels in s if n == "rate_limit_divergence_cause_total" for d, c in [_dc(labels)]}
    assert causes == {
        (forward, "replicas"), (forward, "tighter"), (forward, "fresh_local"), (forward, "clock"),
        (reverse, "uneven"), (reverse, "looser"),
    }  # fmt: skip
    assert _has(s, "rate_limit_divergence_cause_total", route="search", direction=forward, cause="replicas")
    assert _has(s, "rate_limit_shadow_dropped_total", route="search")
    assert not [k for k in s if k[0] == "rate_limit_external_limits_total"]  # no external limits on it
    # counted, then announced again (a rules reload): the count is kept
    m.mode_changes.labels("search", "shadow", "true").inc()
    m.child(m.decisions, "search", "shadow", "local", "true").inc(3)
    m.add_route("search")
    text = m.render().decode()
    assert metric_value(text, "rate_limit_mode_changes_total", route="search", to="shadow", automatic="true") == 1
    assert metric_value(text, "rate_limit_decisions_total", route="search", mode="shadow", allowed="true") == 3
    # the route gains external limits: their sources appear, the rest is untouched
    m.add_route("search", external=True)
    s = _samples(m)
    for source in ("external", "cache", "stale", "static"):
        assert _has(s, "rate_limit_external_limits_total", route="search", source=source)
    assert _has(s, "rate_limit_mode_changes_total", 1.0, route="search", to="shadow", automatic="true")
    assert "rate_limit_external_limits_total" in exported_names(m.render().decode())


def test_latency_buckets_resolve_10_to_20_microseconds():
    m = Metrics()
    h = m.child(m.latency, "shadow")
    for us in (8, 12, 18, 40):
        h.observe(us / 1_000_000)
    text = m.render().decode()

    def below(le: str) -> float:
        return metric_value(text, "rate_limit_decision_duration_seconds_bucket", mode="shadow", le=le)

    assert m.latency.bounds[0] <= 0.000005
    assert (below("1e-05"), below("2e-05"), below("5e-05"), below("+Inf")) == (1, 3, 4, 4)


def test_a_route_that_is_gone_loses_every_series_and_comes_back_at_0():
    m = Metrics()
    for route in ("stays", "goes"):
        m.add_route(route, envoy=True, external=True)
        m.set_mode(route, "enforce")
        m.child(m.decisions, route, "enforce", "distributed", "true").inc(3)
        m.child(m.tokens_remaining, "distributed", route).set(7)
        m.mode_changes.labels(route, "enforce", "false").inc()
    m.remove_route("goes")
    names = {labels.get("route") for (_, fs), _ in _samples(m).items() for labels in [dict(fs)]}
    assert "goes" not in names and "stays" in names and m.routes() == ["stays"]
    assert _has(_samples(m), "rate_limit_decisions_total", 3.0, route="stays", mode="enforce",
                enforced_by="distributed", allowed="true")  # fmt: skip
    m.add_route("goes")  # back: at 0, and the cached child counts into the exported series again
    m.child(m.decisions, "goes", "enforce", "distributed", "true").inc()
    s = _samples(m)
    assert _has(s, "rate_limit_decisions_total", 1.0, route="goes", mode="enforce", enforced_by="distributed",
                allowed="true")  # fmt: skip
    assert _has(s, "rate_limit_shadow_divergence_total", route="goes", direction="agree")


def test_routes_past_the_bound_count_under_other_and_metrics_render_beside_the_loop():
    import asyncio

    from control_plane.observe.metrics import OTHER_ROUTES

    m = Metrics(max_routes=3)
    for i in range(10):
        m.add_route(f"edge/k=v{i}", envoy=True)
        m.set_mode(f"edge/k=v{i}", "shadow")
    m.child(m.decisions, "edge/k=v7", "shadow", "local", "true").inc()
    m.child(m.decisions, "edge/k=v8", "shadow", "local", "true").inc()
    m.child(m.decisions, "edge/k=v1", "shadow", "local", "true").inc()
    m.mode_changed("edge/k=v9", "enforce", True)
    s = _samples(m)
    routes = {dict(fs).get("route") for (_, fs) in s if dict(fs).get("route")}
    assert routes == {"edge/k=v0", "edge/k=v1", "edge/k=v2", OTHER_ROUTES}
    assert _has(s, "rate_limit_decisions_total", 2.0, route=OTHER_ROUTES, mode="shadow", enforced_by="local",
                allowed="true")  # fmt: skip
    assert _has(s, "rate_limit_mode_changes_total", 1.0, route=OTHER_ROUTES, to="enforce", automatic="true")
    assert _has(s, "rate_limit_envoy_hits_total", route=OTHER_ROUTES, stat="total_hits")
    assert not any(name == "rate_limit_route_mode" and dict(fs)["route"] == OTHER_ROUTES for name, fs in s)
    # a route with its own series leaves: the next new route takes its place
    m.remove_route("edge/k=v2")
    m.add_route("edge/k=v42")
    assert "edge/k=v42" in m.routes() and "edge/k=v2" not in m.routes()
    text = asyncio.run(m.render_async()).decode()
    ours = [line for line in text.splitlines() if "rate_limit_" in line]
    assert ours == [line for line in m.render().decode().splitlines() if "rate_limit_" in line]
    assert 'route="edge/k=v42"' in text and 'route="edge/k=v9"' not in text
