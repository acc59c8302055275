"""The event loop a TLS port is served on: asyncio's (uvloop's where installed) with every
TLS listener's handshake bounded by ``SHADOWLIMIT_TLS_HANDSHAKE_TIMEOUT_S``.

uvicorn opens the HTTP port's listener itself and gives asyncio no handshake timeout, so a
client that stalls mid-handshake would hold its connection for asyncio's default of a
minute. The loop's ``create_server`` fills the timeout in for any listener with TLS.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

__all__ = ["handshake_bounded_loop"]


def handshake_bounded_loop(timeout_s: float) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop factory (``asyncio.Runner(loop_factory=...)``) whose TLS listeners cut a
    handshake not done within ``timeout_s``."""
    base: type[Any]
    try:
        import uvloop

        base = uvloop.Loop
    except ImportError:  # pragma: no cover - installed with the package on Linux
        base = asyncio.SelectorEventLoop

    class HandshakeBoundedLoop(base):  # type: ignore[misc]
        async def create_server(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", timeout_s)
            return await super().create_server(*args, **kwargs)

    return HandshakeBoundedLoop
