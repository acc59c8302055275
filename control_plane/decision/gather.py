"""Single decisions asked in one pass of the event loop, decided as one batch.

A server under load reads many requests in one pass of its event loop and runs their
handlers one after another. Each ``POST /v1/decide`` (or forward-auth question, or request
through the middleware) calls :meth:`~.decider.Decider.decide` for one request. Made one by
one, every decision pays the batch's fixed work (the batch record, the metric flush, the
plan lookups) and, in enforce, a Redis call of its own; made together, they pay it once per
pass, and the distributed answers of the whole pass go to Redis as one burst (one call of
the script made for many keys on one server).

The first caller of a pass opens a :class:`Gathering` and starts the decider's task for it;
the callers that run before that task's first step join it (up to :data:`MAX_GATHERED`) and
wait. The task decides the gathering as a batch, in the order the callers asked: each answer
is what that caller alone would have got at that moment, exactly as with a batch request.

The batch is the decider's task, not a caller's: a caller cancelled while it waits (its client
went away) leaves the others' decisions alone (its own request is decided and counted all
the same).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["MAX_GATHERED", "Gathering"]

MAX_GATHERED = 256  # decisions in one gathering; the next caller opens another


class Gathering:
    """The decisions asked in one pass of the loop: the inputs in order, and the future
    each caller waits on."""

    __slots__ = ("headers", "inputs", "waiters")

    def __init__(self, headers: bool) -> None:
        self.headers = headers  # render the rate-limit headers (one flag per batch)
        self.inputs: list[Any] = []
        self.waiters: list[asyncio.Future[Any]] = []  # inputs[i]'s caller waits on waiters[i]

    def join(self, inp: Any) -> asyncio.Future[Any]:
        """Add a caller's input; its answer (or exception) comes on the returned future."""
        self.inputs.append(inp)
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        return waiter

    def answer(self, out: list[Any]) -> None:
        """Each waiting caller's answer (a result, or its item's exception), in place."""
        for waiter, res in zip(self.waiters, out):
            if not waiter.done():  # a caller cancelled while it waited
                waiter.set_result(res)

    def fail(self, exc: BaseException) -> None:
        """The batch itself failed (unexpected, or cancelled at shutdown): every waiting
        caller gets the exception, or is cancelled."""
        for waiter in self.waiters:
            if not waiter.done():
                if isinstance(exc, asyncio.CancelledError):
                    waiter.cancel()
                else:
                    waiter.set_exception(exc)
