"""Hypothesis strategies shared by the differential tests (tests/integration/test_differential.py,
test_peek_parity.py, test_charge_parity.py): policies of every algorithm (or of those given) over
a spread of rates, periods and bursts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from limiter import Algorithm, Policy

__all__ = ["policies"]


@st.composite
def policies(draw: Any, algorithms: Sequence[Algorithm] = tuple(Algorithm)) -> Policy:
    alg = draw(st.sampled_from(list(algorithms)))
    if alg.windowed:
        average = draw(st.sampled_from([1, 2, 3, 7, 10, 50, 12.5]))
    else:
        average = draw(st.sampled_from([0.5, 1, 3, 7.7, 10, 100, 1000, 33.333]))
    period = draw(st.sampled_from([0.001, 0.01, 0.25, 1.0, 3.0, 60.0]))
    burst = draw(st.integers(1, 40))
    return Policy(average=average, period=period, burst=burst, algorithm=alg)
