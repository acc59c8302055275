"""The RESP pieces of the scripts' calls (:mod:`.redis_limiter`): one request's call of a
script under a policy (:class:`Prepared`), a run of requests under one script and policy in one
call of its script made for many (:class:`Run`, :func:`~limiter.scripts.many`), and waiting for
a reply within a deadline (:func:`within`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from functools import cache
from typing import Any

from .errors import BackendError, DeadlineExceeded
from .policy import Policy, make_decision
from .resp import bulk
from .scripts import Script, many, policy_args

__all__ = ["Prepared", "Run", "within"]


def _expire(fut: asyncio.Future[Any], timeout_s: float) -> None:
    if not fut.done():  # the reply, when it comes, finds its future done and is dropped
        fut.set_exception(DeadlineExceeded(f"Redis did not answer within {timeout_s * 1000:.1f} ms"))


def _drop(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def within(aw: Any, timeout_s: float) -> Any:
    """``await aw`` if it is done within ``timeout_s``, else :class:`DeadlineExceeded`;
    ``aw`` is never cancelled (a pipelined reply may still be on its way: the connection
    stays in step). A reply's future gets a timer (cheap: no task); a coroutine or a task
    is run as a task and left to finish, its result dropped."""
    if isinstance(aw, asyncio.Future) and not isinstance(aw, asyncio.Task):
        handle = aw.get_loop().call_later(timeout_s, _expire, aw, timeout_s)
        try:
            return await aw
        finally:
            handle.cancel()
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait((task,), timeout=timeout_s)
    except BaseException:
        task.add_done_callback(_drop)
        raise
    if task.done():
        return task.result()
    task.add_done_callback(_drop)
    raise DeadlineExceeded(f"Redis did not answer within {timeout_s * 1000:.1f} ms")


class Prepared:
    """Pre-encoded RESP pieces of one (script, policy) pair: one request's call, and the
    command name of a call for many (:func:`~limiter.scripts.many`). The whole sources sent
    on ``NOSCRIPT`` are the script's, not the policy's: built once per script, when needed."""

    __slots__ = ("script", "head", "mid", "many_head")

    def __init__(self, script: Script, policy: Policy) -> None:
        a1, a2, a3 = policy_args(policy)
        self.script = script
        self.head = b"*9\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n$1\r\n1\r\n" % script.sha.encode()
        self.mid = bulk(a1) + bulk(a2) + bulk(a3)
        self.many_head = b"$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % many(script).sha.encode()

    @property
    def eval_head(self) -> bytes:
        """:attr:`head` with the script's whole source (``EVAL``), for ``NOSCRIPT``."""
        return b"*9\r\n" + _eval(self.script) + b"$1\r\n1\r\n"

    @property
    def many_eval_head(self) -> bytes:
        """:attr:`many_head` with the whole source of the script for many, for ``NOSCRIPT``."""
        return _eval(many(self.script))


@cache
def _eval(script: Script) -> bytes:
    """``EVAL`` and the script's whole source, as RESP bulk strings."""
    return b"$4\r\nEVAL\r\n" + bulk(script.source_bytes)


class Run:
    """Consecutive requests of a burst under one script and policy, decided in one call of
    its ``many`` script: the positions they answer, their keys and (now, cost) arguments as
    RESP bulk strings, and whether an answer is wanted in full."""

    __slots__ = ("prep", "at", "keys", "args", "full", "first")

    def __init__(self, prep: Prepared, first: bytes, full: bool) -> None:
        self.prep = prep
        self.first = first  # the first key (where the call goes: there is one server)
        self.full = full
        self.at: list[int] = []
        self.keys: list[bytes] = []
        self.args: list[bytes] = []

    def command(self, head: bytes) -> bytes:
        """The call: ``head`` (the command name and script: :attr:`Prepared.many_head`, or
        :attr:`Prepared.many_eval_head`), numkeys, KEYS, ARGV."""
        n = len(self.at)
        nb = b"%d" % n
        return b"".join(
            (
                b"*%d\r\n" % (7 + 3 * n),
                head,
                b"$%d\r\n%b\r\n" % (len(nb), nb),
                *self.keys,
                b"$1\r\n1\r\n" if self.full else b"$1\r\n0\r\n",
                self.prep.mid,
                *self.args,
            )
        )

    def answer(
        self,
        reply: Any,
        out: list[Any],
        rejected: Callable[[Prepared, Any], BackendError],
        verdicts: bool,
        full: Collection[int],
    ) -> None:
        """Each request's answer from its call's ``reply`` (or the BackendError the call
        failed with), into ``out``: a Decision, or only its verdict with ``verdicts`` unless
        ``full`` holds its position; an item that is no answer gets ``rejected(prep, item)``."""
        if type(reply) is not list or len(reply) != len(self.at):
            failed = reply if isinstance(reply, BackendError) else rejected(self.prep, reply)
            for pos in self.at:
                out[pos] = failed
        elif self.full:
            for pos, r in zip(self.at, reply):
                if type(r) is list and len(r) == 5:
                    if not verdicts or pos in full:
                        out[pos] = make_decision(r[0] == 1, r[1], r[2], r[3], r[4])
                    else:
                        out[pos] = r[0] == 1
                else:
                    out[pos] = rejected(self.prep, r)
        else:
            for pos, r in zip(self.at, reply):
                out[pos] = r == 1 if r.__class__ is int else rejected(self.prep, r)
