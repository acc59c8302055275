"""What the compared requests of a budget route cost, in its ``cost_unit``: the divergence counted
in units as well as in requests ("would have refused 14 requests worth 2.1M tokens"). Pure: from
the summed counters (:func:`control_plane.store.totals_of`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .rollout import Divergence

__all__ = ["amount", "units_field", "units_view"]

_LADD = Divergence.LOCAL_ALLOW_DISTRIBUTED_DENY
_LDDA = Divergence.LOCAL_DENY_DISTRIBUTED_ALLOW


def amount(n: float) -> str:
    """A count of units for people: ``950``, ``14k``, ``2.1M``, ``3.4G``."""
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            text = f"{n / scale:.1f}".removesuffix(".0")
            return f"{text}{suffix}"
    return f"{int(n)}"


def units_field(divergence: Divergence, *, estimated: bool = False) -> str:
    """The units (a budget's tokens, credits...) of the compared requests of one class in a
    route's minute: ``units_<class>`` counts each at its actual cost where it was settled and
    at its estimate (or cost) otherwise; ``units_estimated_<class>``, the part still counted
    at an estimate (a reservation not settled yet, or never)."""
    return f"units_estimated_{divergence.value}" if estimated else f"units_{divergence.value}"


def _part(totals: Mapping[str, Any], div: Divergence) -> dict[str, int]:
    units = int(totals.get(units_field(div), 0))
    estimated = int(totals.get(units_field(div, estimated=True), 0))
    return {"requests": int(totals.get(div.value, 0)), "units": units, "estimated": estimated}


def units_view(totals: Mapping[str, Any], unit: str | None) -> dict[str, Any]:
    """A budget route's divergence in units: per direction the requests, what they cost
    (``units``: the actual cost where settled, the estimate or the cost known at the decision
    otherwise) and how much of it is still an estimate; and the new rejections in words."""
    name = unit or "units"
    new, reverse = _part(totals, _LADD), _part(totals, _LDDA)
    n = new["requests"]
    text = f"would have refused {n} request{'' if n == 1 else 's'} worth {amount(new['units'])} {name}"
    if new["estimated"]:
        text += f" ({amount(new['estimated'])} of it estimated: reservations not settled yet)"
    return {
        "unit": name,
        "agree": _part(totals, Divergence.AGREE),
        "new_rejections": new,
        "reverse": reverse,
        "summary": text,
    }
