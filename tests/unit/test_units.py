"""A budget route's divergence in its cost unit (control_plane/model/units.py): amounts for people
and the figures of each direction, the new rejections in words saying how much is estimated."""

from __future__ import annotations

import pytest

from control_plane.model.units import amount, units_view


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (950, "950"),
        (1000, "1k"),
        (14_200, "14.2k"),
        (2_100_000, "2.1M"),
        (3_000_000_000, "3G"),
        (-1500, "-1.5k"),
    ],  # fmt: skip
)
def test_amounts_read_as_people_write_them(n, text):
    assert amount(n) == text


def test_the_new_rejections_in_words_say_what_is_still_an_estimate():
    totals = {
        "agree": 100, "local_allow_distributed_deny": 14, "local_deny_distributed_allow": 2,
        "units_agree": 50_000, "units_local_allow_distributed_deny": 2_100_000,
        "units_local_deny_distributed_allow": 900,
        "units_estimated_local_allow_distributed_deny": 300_000,
    }  # fmt: skip
    view = units_view(totals, "tokens")
    assert view["new_rejections"] == {"requests": 14, "units": 2_100_000, "estimated": 300_000}
    assert view["reverse"] == {"requests": 2, "units": 900, "estimated": 0}
    assert view["summary"] == (
        "would have refused 14 requests worth 2.1M tokens (300k of it estimated: reservations not settled yet)"
    )
    settled = units_view({**totals, "units_estimated_local_allow_distributed_deny": 0}, None)
    assert settled["unit"] == "units" and settled["summary"] == "would have refused 14 requests worth 2.1M units"
