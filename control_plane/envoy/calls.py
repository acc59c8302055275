"""A connection's calls run: each as a task of the event loop, started once a turn's reads
are in (:meth:`Calls.start_ready`), its method's answers written by :class:`.streams.Output`;
the kinds of :class:`.wire.Method`: ``unary`` (one request, one answer), ``gathered`` (unary,
the calls of one turn's reads answered by one call of the method, in one task: Envoy's
``ShouldRateLimit``, whose calls arrive by the dozen in one read and are decided together),
``stream`` (one request, answers from an async iterator: health's Watch) and ``each`` (an
answer per request message: reflection). Read by :mod:`.transport`.

A call of a gathering that is reset while its method runs is answered no more (its stream is
dropped); the method runs on for the others, as its work for that call is already done or
being done. A connection lost cancels its gatherings as it cancels its calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .streams import Output, Stream
from .wire import Call, Limits, Method, RpcError, StatusCode

__all__ = ["CANCELS_PER_TURN", "Calls", "cancel_in_turns"]

log = logging.getLogger("shadowlimit.grpc")


class Calls(Output):
    """The calls of a connection (see the module docstring); ``ready`` holds the streams
    whose calls start at the end of this turn's reads."""

    def __init__(self, limits: Limits, owner: Any) -> None:
        super().__init__(limits, owner)
        self.ready: list[Stream] = []  # calls to start once this turn's reads are in
        self.gatherings: set[asyncio.Task[None]] = set()  # the tasks of gathered methods running

    def start_ready(self) -> None:
        """The calls whose requests this turn's reads completed, each started as a task (those
        of a ``gathered`` method in one task a method)."""
        if not self.ready:
            return
        ready, self.ready = self.ready, []
        gathered: dict[int, tuple[Method, list[Stream], list[bytes]]] = {}
        for stream in ready:
            if stream.done or stream.task is not None:
                continue
            method = stream.method
            if method is None:
                continue
            if method.kind == "each":
                coro: Awaitable[None] = self._each(stream, method.fn)
            else:
                try:
                    message = stream.reader.only()
                except RpcError as exc:
                    self.finish(stream, None, exc.code, exc.message)
                    continue
                if method.kind == "gathered":
                    _, streams, messages = gathered.setdefault(id(method), (method, [], []))
                    streams.append(stream)
                    messages.append(message)
                    continue
                runner = self._unary if method.kind == "unary" else self._server_stream
                coro = runner(stream, method.fn, message)
            stream.task = self.loop.create_task(coro)  # type: ignore[arg-type]
        for method, streams, messages in gathered.values():
            task = self.loop.create_task(self._gathered(streams, method.fn, messages))
            self.gatherings.add(task)
            task.add_done_callback(self.gatherings.discard)

    async def _gathered(self, streams: list[Stream], fn: Callable[..., Any], messages: list[bytes]) -> None:
        calls = [stream.call for stream in streams]
        try:
            answers = await fn(messages, calls)
        except Exception:  # the method's bug: logged, its calls end INTERNAL
            log.exception("gRPC method %s failed", calls[0].path if calls[0] else "?")
            for stream in streams:
                self.finish(stream, None, StatusCode.INTERNAL, "internal error")
            return
        for stream, answer in zip(streams, answers, strict=True):
            if isinstance(answer, RpcError):
                self.finish(stream, None, answer.code, answer.message)
            else:
                self.finish(stream, answer, StatusCode.OK, "")

    async def _unary(self, stream: Stream, fn: Callable[[bytes, Call], Awaitable[bytes]], message: bytes) -> None:
        try:
            answer = await fn(message, stream.call)  # type: ignore[arg-type]
        except RpcError as exc:
            self.finish(stream, None, exc.code, exc.message)
        except Exception:  # the method's bug: logged, the call ends INTERNAL
            log.exception("gRPC method %s failed", stream.call.path if stream.call else "?")
            self.finish(stream, None, StatusCode.INTERNAL, "internal error")
        else:
            self.finish(stream, answer, StatusCode.OK, "")

    async def _server_stream(
        self, stream: Stream, fn: Callable[[bytes, Call], AsyncIterator[bytes]], message: bytes
    ) -> None:
        await self._run_stream(stream, fn(message, stream.call))  # type: ignore[arg-type]

    async def _each(self, stream: Stream, fn: Callable[[bytes, Call], bytes]) -> None:
        await self._run_stream(stream, self._answers_each(stream, fn))

    async def _answers_each(self, stream: Stream, fn: Callable[[bytes, Call], bytes]) -> AsyncIterator[bytes]:
        """An answer per request message, each made once the last has left (the request's
        bytes are given back as they are consumed)."""
        reader = stream.reader
        while True:
            message = reader.next()
            if message is None:
                if stream.ended:
                    if reader.buf:
                        raise RpcError(StatusCode.INTERNAL, "the request ended inside a message")
                    return
                await self._wait(stream)
                continue
            self.give_back(stream.sid, reader.consumed)
            stream.held -= reader.consumed
            reader.consumed = 0
            yield fn(message, stream.call)  # type: ignore[arg-type]

    async def _run_stream(self, stream: Stream, answers: AsyncIterator[bytes]) -> None:
        try:
            async for answer in answers:
                while (stream.pending or self.pending >= self.limits.max_pending_output) and not stream.done:
                    await self._wait(stream)  # the last answer has not left yet: make no more
                if stream.done:
                    return
                self.send_message(stream, answer)
        except RpcError as exc:
            self.finish(stream, None, exc.code, exc.message)
        except Exception:
            log.exception("gRPC method %s failed", stream.call.path if stream.call else "?")
            self.finish(stream, None, StatusCode.INTERNAL, "internal error")
        else:
            self.finish(stream, None, StatusCode.OK, "")

    async def _wait(self, stream: Stream) -> None:
        stream.wake = asyncio.Event()
        await stream.wake.wait()
        stream.wake = None


#: methods cancelled per turn of the event loop when their connection is lost
CANCELS_PER_TURN = 32


def cancel_in_turns(loop: Any, tasks: list[asyncio.Task[None]]) -> None:
    """Cancel ``tasks``, :data:`CANCELS_PER_TURN` a turn: a connection lost with a thousand
    Watch calls open would otherwise have the next turn run a thousand cancellations."""
    for task in tasks[:CANCELS_PER_TURN]:
        task.cancel()
    if len(tasks) > CANCELS_PER_TURN:
        loop.call_soon(cancel_in_turns, loop, tasks[CANCELS_PER_TURN:])
