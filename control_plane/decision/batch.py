"""What one call of the decider carries between its steps (:mod:`.decider`): the call's items
and what is known about each so far (:class:`Batch`), and a request waiting for its
distributed answer (:class:`Pending`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from limiter import Decision, Policy
from limiter.resilience import FailurePolicy

from .types import DecideInput, InputLike, PlainInput

if TYPE_CHECKING:
    from ..external import Resolution
    from ..rules import RouteRule
    from .plan import RoutePlan
    from .shadow import ShadowItem

__all__ = ["Batch", "Pending"]


class Pending:
    """A request waiting for its distributed answer: where its answer goes (``index``), what
    it was decided with so far, and its request to Redis (``request``: bucket key, distributed
    policy, cost, time in microseconds) with the failure policy and code that answer for Redis
    when it fails; ``ref``, its local policy when its route explains its divergence."""

    __slots__ = ("index", "plan", "key", "local", "request_id", "res", "request", "failure", "ref")

    def __init__(
        self,
        *,
        index: int,
        plan: RoutePlan,
        key: str,
        local: Decision,
        request_id: str,
        res: Resolution | None,
        request: tuple[str, Policy, int, int],
        failure: tuple[FailurePolicy | None, int | None],
        ref: Policy | None = None,
    ) -> None:
        self.index = index
        self.plan = plan
        self.key = key
        self.local = local
        self.request_id = request_id
        self.res = res
        self.request = request
        self.failure = failure
        self.ref = ref  # the local policy, when the route explains its divergence (the reference's)

    @property
    def now_s(self) -> float:
        return self.request[3] / 1_000_000


class Batch:
    """One call's items and what is known about each so far."""

    __slots__ = (
        "inputs", "items", "headers", "out", "rules", "keys", "lookups", "ext", "plans", "pend", "inline", "budget",
        "cached",
    )  # fmt: skip

    def __init__(
        self, inputs: Sequence[InputLike | PlainInput], headers: bool, inline: bool = False, budget: float | None = None
    ) -> None:
        n = len(inputs)
        self.inputs = inputs
        self.items: Sequence[Any] = inputs  # becomes a copy when a tuple is turned into a DecideInput
        self.headers = headers  # render each answer's rate-limit headers
        self.out: list[Any] = [None] * n
        self.rules: list[RouteRule | None] = [None] * n
        self.keys: list[Any] = [None] * n  # the key, or the item's exception
        self.lookups: list[int] = []
        self.ext: dict[int, Resolution] = {}
        self.plans: dict[str, RoutePlan] = {}  # the plans this batch has used
        self.pend: list[Pending] = []  # requests waiting for their distributed answer
        # shadow evaluations made in the request path (inline_shadow): (index, the ShadowItem)
        self.inline: list[tuple[int, ShadowItem]] | None = [] if inline else None
        self.budget = budget  # seconds left for Redis (the caller's deadline), None: no deadline
        # requests the over-limit cache answers: (the pending request, the refusal)
        self.cached: list[tuple[Pending, Decision]] = []

    def full(self, i: int) -> InputLike:
        """Item ``i`` as an object with named fields (a PlainInput is converted, in a copy of the list)."""
        inp = self.items[i]
        if inp.__class__ is not tuple:
            return inp  # type: ignore[no-any-return]
        if self.items is self.inputs:
            self.items = list(self.inputs)
        route, key, cost, request_id = inp
        full = DecideInput(route=route, key=key, cost=cost, request_id=request_id)
        self.items[i] = full  # type: ignore[index]
        return full
