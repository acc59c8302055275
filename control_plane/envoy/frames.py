"""A walk over the frame headers a client sends, before python-hyper's h2 reads them: the
few checks of RFC 9113 that h2 does not make, and the flood bounds a server facing the
internet keeps (as Envoy, nginx and Go count them). Pure: bytes and the clock in, a verdict
out.

* RST_STREAM or WINDOW_UPDATE on an idle stream (one the client never opened) is a
  connection error PROTOCOL_ERROR (RFC 9113 5.1, 6.4, 6.9); h2 ignores both;
* a header block (HEADERS and its CONTINUATIONs) over :data:`MAX_HEADER_BLOCK` bytes is
  ENHANCE_YOUR_CALM (h2 would buffer 64 frames of up to 16 KiB);
* more than :data:`MAX_EMPTY_RUN` DATA, HEADERS or CONTINUATION frames in a row with no
  payload and no END_STREAM (work for nothing, Envoy's
  ``max_consecutive_inbound_frames_with_empty_payload``) is ENHANCE_YOUR_CALM;
* SETTINGS, PING (not acknowledgements), PRIORITY and unknown frames draw from a bucket of
  :data:`CONTROL_BURST` frames refilled at :data:`CONTROL_RATE` a second; a client that
  empties it is ENHANCE_YOUR_CALM;
* a HEADERS frame on a stream the client opened before, without END_STREAM, is trailers that
  do not end the stream: malformed (RFC 9113 8.1), a stream error, where h2 would end the
  connection. Its END_STREAM flag is set (:attr:`FrameWalk.patches`, offsets in the bytes
  walked) so that h2 reads its header block (HPACK's table stays in step), and the stream is
  named in :attr:`FrameWalk.bad_trailers` for the transport to reset.

A walk also ends early, at a frame's start, after :data:`WALK_FRAMES` frames or
:data:`WALK_NEW_STREAMS` new streams (:attr:`FrameWalk.cut`): the transport hands h2 what
came before and keeps the rest for the next turn of the event loop, so that a read of tiny
frames (thousands of HEADERS in 32 KiB, each a new stream for h2 to set up) cannot hold the
loop for more than a few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from h2.errors import ErrorCodes

__all__ = [
    "CONTROL_BURST", "CONTROL_RATE", "MAX_EMPTY_RUN", "MAX_HEADER_BLOCK", "WALK_FRAMES", "WALK_NEW_STREAMS",
    "FrameWalk", "Refusal",
]  # fmt: skip

PREFACE_BYTES = 24
MAX_HEADER_BLOCK = 64 * 1024
MAX_EMPTY_RUN = 16
CONTROL_BURST = 10_000
CONTROL_RATE = 1_000.0
WALK_FRAMES = 256
WALK_NEW_STREAMS = 16

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the connection ends: an HTTP/2 error code and a reason for the GOAWAY."""

    code: ErrorCodes
    reason: str


class FrameWalk:
    """The frames of one connection, walked as its bytes arrive (see the module docstring)."""

    __slots__ = (
        "preface_left", "skip", "head", "opened", "block", "empty_run", "tokens", "refilled", "patches", "bad_trailers",
        "cut",
    )  # fmt: skip

    def __init__(self, now: float) -> None:
        self.preface_left = PREFACE_BYTES
        self.skip = 0  # payload bytes of the current frame still to come
        self.head = b""  # a frame header split between two reads
        self.opened = 0  # the highest stream id a HEADERS frame named
        self.block = -1  # bytes of the header block being continued (-1: none)
        self.empty_run = 0
        self.tokens = float(CONTROL_BURST)
        self.refilled = now
        self.patches: list[int] = []  # flags bytes to give END_STREAM, in the bytes last walked
        self.bad_trailers: set[int] = set()  # streams whose trailers did not end them
        self.cut = False  # the last walk ended early (see the module docstring)

    def walk(self, data: bytes, now: float) -> tuple[int, Refusal | None]:
        """How many bytes of ``data`` may be read by h2 now, and the refusal of the frame
        that starts there (None: none refused; :attr:`cut`: the rest is for the next turn)."""
        n = len(data)
        pos = frames = new_streams = 0
        self.cut = False
        if self.preface_left:
            pos = min(self.preface_left, n)
            self.preface_left -= pos
        if self.skip:
            take = min(self.skip, n - pos)
            self.skip -= take
            pos += take
        self.patches.clear()
        while pos < n:
            start = pos
            carried = len(self.head)
            if carried:
                need = 9 - carried
                header = self.head + data[pos : pos + need]
                pos += min(need, n - pos)
                start = 0  # the frame began in an earlier read, which h2 has already seen
            else:
                if frames >= WALK_FRAMES:
                    self.cut = True
                    return start, None
                header = data[pos : pos + 9]
                pos += min(9, n - pos)
            if len(header) < 9:
                self.head = header
                return n, None
            self.head = b""
            length = int.from_bytes(header[:3], "big")
            sid = int.from_bytes(header[5:9], "big") & 0x7FFFFFFF
            frames += 1
            if header[3] == HEADERS and sid & 1 and sid > self.opened:
                new_streams += 1
                if new_streams > WALK_NEW_STREAMS and not carried:
                    self.cut = True
                    return start, None
            if header[3] == HEADERS and not header[4] & END_STREAM and sid & 1 and sid <= self.opened:
                self._trailers(sid, start + 4 - carried if carried <= 4 else -1)
            refusal = self._check(header[3], header[4], sid, length, now)
            if refusal is not None:
                return start, refusal
            take = min(length, n - pos)
            pos += take
            self.skip = length - take
        return n, None

    def _trailers(self, sid: int, flags_at: int) -> None:
        """Trailers without END_STREAM on ``sid`` (see the module docstring); a flags byte
        read by h2 already (a header split between reads) cannot be changed: h2 refuses."""
        if flags_at < 0:
            return
        self.patches.append(flags_at)
        if len(self.bad_trailers) >= 1024:  # streams h2 closed before the transport looked
            self.bad_trailers.clear()
        self.bad_trailers.add(sid)

    def _check(self, ftype: int, flags: int, sid: int, length: int, now: float) -> Refusal | None:
        if ftype == DATA or ftype == HEADERS or ftype == CONTINUATION:
            if length == 0 and not (ftype != CONTINUATION and flags & END_STREAM):
                self.empty_run += 1
                if self.empty_run > MAX_EMPTY_RUN:
                    return Refusal(ErrorCodes.ENHANCE_YOUR_CALM, f"more than {MAX_EMPTY_RUN} empty frames in a row")
            else:
                self.empty_run = 0
            if ftype == HEADERS:
                if sid & 1 and sid > self.opened:
                    self.opened = sid
                self.block = -1 if flags & END_HEADERS else length
            elif ftype == CONTINUATION and self.block >= 0:
                self.block += length
                if self.block > MAX_HEADER_BLOCK:
                    return Refusal(ErrorCodes.ENHANCE_YOUR_CALM, f"a header block over {MAX_HEADER_BLOCK} bytes")
                if flags & END_HEADERS:
                    self.block = -1
            return None
        if ftype == RST_STREAM or ftype == WINDOW_UPDATE:
            if sid and (sid > self.opened or not sid & 1):
                name = "RST_STREAM" if ftype == RST_STREAM else "WINDOW_UPDATE"
                return Refusal(ErrorCodes.PROTOCOL_ERROR, f"{name} on idle stream {sid}")
            return None
        if (ftype == SETTINGS or ftype == PING) and flags & ACK or ftype == GOAWAY or ftype == PUSH_PROMISE:
            return None
        # SETTINGS, PING, PRIORITY and frame types h2 does not know: control work
        self.tokens = min(CONTROL_BURST, self.tokens + (now - self.refilled) * CONTROL_RATE)
        self.refilled = now
        self.tokens -= 1
        if self.tokens < 0:
            return Refusal(ErrorCodes.ENHANCE_YOUR_CALM, f"control frames faster than {CONTROL_RATE:.0f} a second")
        return None
