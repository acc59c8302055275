"""Metric families kept in plain Python numbers and exported at scrape time
(:class:`FastCounter`, :class:`FastGauge`, :class:`FastHistogram`): prometheus-client takes
a lock on every increment (about 2 us here), and the decision path increments several per
request from one event loop. Not for use from several threads at once."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["FastCounter", "FastGauge", "FastHistogram"]


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def set(self, value: float) -> None:
        self.value = value


class _Family:
    """A labelled metric kept in plain Python numbers and exported at scrape time.

    prometheus-client takes a lock on every increment (about 2 us here); the decision
    path increments several counters per request from one event loop, so it uses these
    lock-free children instead. Not for use from several threads at once.
    """

    kind = "counter"

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._children: dict[tuple[str, ...], _Value] = {}
        # the series of each route, for a family with a route label (remove_where)
        self._route_at = labelnames.index("route") if "route" in labelnames else None
        self._by_route: dict[str, list[tuple[str, ...]]] = {}
        registry.register(self)

    def labels(self, *values: str) -> _Value:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[values] = _Value()
            self._indexed(values)
        return child

    def _indexed(self, values: tuple[str, ...]) -> None:
        if self._route_at is not None:
            self._by_route.setdefault(values[self._route_at], []).append(values)

    def collect(self) -> Iterator[Metric]:
        fam: Any
        if self.kind == "counter":
            fam = CounterMetricFamily(self.name.removesuffix("_total"), self.documentation, labels=self.labelnames)
        else:
            fam = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            fam.add_metric(list(values), child.value)
        yield fam

    def describe(self) -> list[Metric]:
        return []

    def samples(self) -> dict[tuple[str, ...], float]:
        return {k: v.value for k, v in self._children.items()}

    def remove_route(self, route: str) -> None:
        """Drop the series of ``route`` (gone from the rules): as many steps as it has series."""
        for key in self._by_route.pop(route, ()):
            self._children.pop(key, None)


class FastCounter(_Family):
    kind = "counter"


class _HistValue:
    """One labelled histogram: a count per bucket (not cumulative), the sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class FastHistogram(_Family):
    """A histogram with lock-free children (exported as prometheus-client's Histogram is:
    the same buckets, ``le`` labels, ``_sum`` and ``_count``)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: list[str],
        registry: CollectorRegistry,
        buckets: tuple[float, ...],
    ) -> None:
        self.bounds = tuple(sorted(buckets))
        super().__init__(name, documentation, labelnames, registry)

    def labels(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            child = self._children[values] = _HistValue(self.bounds)  # type: ignore[assignment]
            self._indexed(values)
        return child

    def collect(self) -> Iterator[Metric]:
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            h: Any = child
            total, buckets = 0, []
            for bound, n in zip((*self.bounds, math.inf), h.counts):
                total += n
                buckets.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
            fam.add_metric(list(values), buckets, h.sum)
        yield fam


class FastGauge(_Family):
    kind = "gauge"
