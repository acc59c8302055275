"""The fleet views' background refresh reads a few hundred routes at a time: a
4 MiB Envoy configuration's 58,000 routes are read a slice at a time, not in one burst that
never ends, and a slice that fails leaves the views as they were, flagged."""

from __future__ import annotations

from typing import Any

import pytest

from control_plane.observe.views import CHUNK, FleetViews


class FakeRules:
    def __init__(self, names: list[str]) -> None:
        self.current = names

    def names(self) -> list[str]:
        return self.current

    def get(self, name: str) -> object | None:
        return name if name in self.current else None


class Divergence:
    def __init__(self) -> None:
        self.reads: list[str] = []
        self.fail = False

    async def series(self, name: str, minutes: int) -> list[dict[str, int]]:
        if self.fail:
            raise RuntimeError("Redis went away")
        self.reads.append(name)
        return [{"compared": len(name)}]


class Blocked:
    async def fleet_top(self, client: Any, name: str, n: int) -> list[Any]:
        return [(name, 1)]

    def top(self, name: str, n: int) -> list[Any]:
        return []


def views_of(names: list[str], clock: list[float]) -> tuple[FleetViews, Divergence, FakeRules]:
    div, rules = Divergence(), FakeRules(names)
    views = FleetViews(div, Blocked(), None, lambda: rules, clock=lambda: clock[0])  # type: ignore[arg-type]
    return views, div, rules


async def test_a_pass_over_many_routes_reads_a_slice_per_step_and_publishes_at_its_end() -> None:
    clock = [100.0]
    names = [f"r{i}" for i in range(CHUNK * 2 + 7)]
    views, div, _ = views_of(names, clock)
    assert await views.step() is False and len(div.reads) == CHUNK
    clock[0] = 200.0
    assert await views.step() is False and views.at == 0.0
    assert await views.step() is True
    assert len(div.reads) == len(names) and views.at == 100.0 and views.error is None  # when the pass began
    assert (await views.route(names[-1]))["series"] == [{"compared": len(names[-1])}]


async def test_the_first_request_reads_every_route_when_nothing_was_read_yet() -> None:
    views, div, _ = views_of([f"r{i}" for i in range(CHUNK + 3)], [5.0])
    assert await views.route("r3") is not None and len(div.reads) == CHUNK + 3 and views.at == 5.0


async def test_routes_removed_during_a_pass_are_dropped_and_a_failed_slice_flags_the_views() -> None:
    clock = [1.0]
    names = [f"r{i}" for i in range(CHUNK + 1)]
    views, div, rules = views_of(names, clock)
    assert not await views.step()
    rules.current = names[:-1]
    assert await views.step()
    assert await views.route(names[-1]) is None and await views.route("r0") is not None
    div.fail = True
    with pytest.raises(RuntimeError):
        await views.step()
    assert await views.route("r0") is not None  # the last good views stay


async def test_new_rules_start_a_new_pass_over_their_own_routes() -> None:
    names = [f"old{i}" for i in range(CHUNK * 3)]
    views, div, _ = views_of(names, [1.0])
    rules_now = [FakeRules(names)]
    views2 = FleetViews(div, Blocked(), None, lambda: rules_now[0], clock=lambda: 2.0)  # type: ignore[arg-type]
    assert not await views2.step()
    rules_now[0] = FakeRules(["new0", "new1"])  # a reload: the old pass is not finished
    div.reads.clear()
    assert await views2.step() is True
    assert div.reads == ["new0", "new1"] and await views2.route("old5") is None


async def test_routes_past_the_bound_are_read_when_asked_and_kept_a_few_seconds() -> None:
    clock = [10.0]
    div, rules = Divergence(), FakeRules([f"r{i}" for i in range(50)])
    views = FleetViews(div, Blocked(), None, lambda: rules, clock=lambda: clock[0], max_routes=10)  # type: ignore[arg-type]
    await views.refresh()
    assert len(div.reads) == 10  # the background reads the first 10 only
    assert (await views.route("r42"))["series"] == [{"compared": 3}] and div.reads[-1] == "r42"
    await views.route("r42")
    assert div.reads.count("r42") == 1  # kept
    clock[0] += 6
    await views.route("r42")
    assert div.reads.count("r42") == 2  # read again once stale
    assert await views.route("nope") is None and "nope" not in div.reads
