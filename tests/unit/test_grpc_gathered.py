"""A ``gathered`` method (control_plane/envoy/calls.py): the unary calls whose requests one
turn of the event loop completed are answered by one call of the method, in their order, each
call its own answer or error; a call reset while the method runs is answered no more and the
others are; a method that fails ends its calls INTERNAL; a lost connection cancels it. Each
case runs through a pair of connections (tests/grpc_twins.py): the transport as served and one
where h2 reads and writes every frame must write the same (each calls the method: what it is
called with is seen twice, the served connection's first)."""

from __future__ import annotations

import asyncio

import pytest
from grpc_twins import Pair
from test_grpc_unary_reads import END_STREAM, RST_STREAM, SETTINGS, Client, frame

from control_plane.envoy.wire import Call, Limits, Method, RpcError, StatusCode

pytestmark = pytest.mark.timeout(60)


class Gathered:
    """``/t.S/Many``: answers each message reversed ("bad": INVALID_ARGUMENT, "bug": the whole
    call raises); held until :attr:`gate` is set when ``hold``."""

    def __init__(self, *, hold: bool = False) -> None:
        self.batches: list[list[bytes]] = []
        self.deadlines: list[list[float | None]] = []
        self.gate = asyncio.Event()
        if not hold:
            self.gate.set()

    async def many(self, messages: list[bytes], calls: list[Call]) -> list[bytes | RpcError]:
        self.batches.append(list(messages))
        self.deadlines.append([call.time_remaining() for call in calls])
        await self.gate.wait()
        if b"bug" in messages:
            raise ValueError("a bug")
        return [RpcError(StatusCode.INVALID_ARGUMENT, "bad") if m == b"bad" else m[::-1] for m in messages]

    def methods(self) -> dict[str, Method]:
        return {"/t.S/Many": Method("gathered", self.many)}


async def started(method: Gathered) -> tuple[Pair, Client]:
    pair, c = Pair(method.methods(), Limits(max_message_bytes=4096)), Client()
    await pair.feed(c.start() + frame(SETTINGS, 0x1, 0))
    return pair, c


def statuses(data: bytes) -> list[tuple[int, bytes]]:
    """(stream, grpc-status digit) of each trailers block written (the answers' ends, in order)."""
    out, pos = [], 0
    while pos + 9 <= len(data):
        n = int.from_bytes(data[pos : pos + 3], "big")
        if data[pos + 3] == 1 and data[pos + 4] & END_STREAM:
            block = data[pos + 9 : pos + 9 + n]
            at = block.find(b"grpc-status")
            out.append((int.from_bytes(data[pos + 5 : pos + 9], "big"), block[at + 12 : at + 13]))
        pos += 9 + n
    return out


async def test_the_calls_of_one_read_are_one_call_of_the_method_each_answered_in_its_place() -> None:
    method = Gathered()
    pair, c = await started(method)
    bodies = [b"a1", b"bad", b"c3", b"d4"]
    await pair.feed(
        b"".join(c.call("/t.S/Many", body) for body in bodies)
        + c.call("/t.S/Many", b"e5", extra=(("grpc-timeout", "50m"),))
    )
    pair.same()
    assert method.batches == [[*bodies, b"e5"]] * 2  # one call of the method, in the calls' order
    assert method.deadlines[0][:4] == [None] * 4 and 0 < (method.deadlines[0][4] or 0) <= 0.0501
    written = bytes(pair.wires["served"].data)
    assert statuses(written) == [(1, b"0"), (3, b"3"), (5, b"0"), (7, b"0"), (9, b"0")]
    assert b"1a" in written and b"5e" in written  # the answers, each on its stream
    # the next read's calls: another call of the method
    await pair.feed(c.call("/t.S/Many", b"f6") + c.call("/t.S/Many", b"g7"))
    pair.same(settle=True)
    assert method.batches[2:] == [[b"f6", b"g7"]] * 2 and pair.taken >= 1  # (g7: read beside h2)
    await pair.close()


async def test_a_call_reset_while_the_method_runs_is_not_answered_and_the_others_are() -> None:
    method = Gathered(hold=True)
    pair, c = await started(method)
    await pair.feed(b"".join(c.call("/t.S/Many", b"x%d" % i) for i in range(3)))
    assert len(method.batches) == 2 and not statuses(bytes(pair.wires["served"].data))
    await pair.feed(frame(RST_STREAM, 0, 3, (8).to_bytes(4, "big")))  # CANCEL the second
    method.gate.set()
    await pair.feed()
    pair.same(settle=True)
    assert statuses(bytes(pair.wires["served"].data)) == [(1, b"0"), (5, b"0")]
    assert pair.served.owner.counts == {"reset_received": 1}
    await pair.close()


async def test_a_method_that_fails_ends_its_calls_internal_and_the_connection_goes_on() -> None:
    method = Gathered()
    pair, c = await started(method)
    await pair.feed(c.call("/t.S/Many", b"ok") + c.call("/t.S/Many", b"bug"))
    assert statuses(bytes(pair.wires["served"].data)) == [(1, b"1"), (3, b"1")]  # 13: INTERNAL's first digit
    await pair.feed(c.call("/t.S/Many", b"ok"))
    pair.same(settle=True)
    assert statuses(bytes(pair.wires["served"].data))[-1] == (5, b"0")
    await pair.close()


async def test_a_lost_connection_cancels_the_method() -> None:
    method = Gathered(hold=True)
    pair, c = await started(method)
    await pair.feed(c.call("/t.S/Many", b"a") + c.call("/t.S/Many", b"b"))
    tasks = set(pair.served.gatherings)
    assert len(tasks) == 1
    await pair.close()
    assert all(t.cancelled() for t in tasks) and not pair.served.gatherings
