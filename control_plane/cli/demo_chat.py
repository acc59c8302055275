"""The demo's example services and its chat traffic: a per-tenant token budget (the ``chat`` route of
examples/rules.yaml, in shadow) spent by tenants whose answers stream from a small upstream
(examples/chat_upstream.py) that reports what each used.

Each chat request does what a gateway in front of an LLM does: it reserves an estimate with the
decision (``POST /v1/decide`` with ``estimate``: the prompt's tokens and ``max_tokens``), streams
the answer, reads the usage from its last event, and settles the reservation with it
(``POST /v1/settle``) on the replica that reserved it. ``stark`` spreads about 70k tokens a
minute over the replicas: each replica's budget (30k a minute) admits its third, the global one
(45k a minute, 15k at once) would run out after half a minute; ``initech`` stays well within both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CHAT_TENANTS", "CHAT_UPSTREAM", "ChatTenant", "chat_client", "http_pool", "start_example_service"]

ROOT = Path(__file__).resolve().parents[2]
CHAT_UPSTREAM = ROOT / "examples" / "chat_upstream.py"
_PROMPT = "Summarise the attached quarterly report for the board, in plain words. " * 4


@dataclass(frozen=True, kw_only=True)
class ChatTenant:
    """A tenant of the chat route: how often it asks (``rps``), over every replica (``spread``)
    or its own, and how long an answer it allows (``max_tokens``)."""

    name: str
    rps: float
    spread: bool
    max_tokens: int


CHAT_TENANTS: list[ChatTenant] = [
    ChatTenant(name="stark", rps=1.5, spread=True, max_tokens=1000),  # ~70k tokens a minute: over the global 45k
    ChatTenant(name="initech", rps=0.3, spread=False, max_tokens=400),  # ~5k a minute
]


def http_pool() -> Any:
    """The demo clients' connection pool: a connection idle 2 s is not reused, below the 5 s after
    which uvicorn (the replicas, the example services) closes an idle one, so that no request goes
    out on a connection its server is closing at that moment (an httpx ``ReadError``)."""
    import httpx

    return httpx.Limits(keepalive_expiry=2.0)


def start_example_service(
    script: Path, workdir: Path, name: str, port: int, *, clock: Callable[[], float], preexec: Any,
    timeout: float = 15.0,
) -> tuple[subprocess.Popen[bytes], str]:  # fmt: skip
    """One of examples/'s services as its own process on ``port``, up (``/healthz``) within
    ``timeout``; its output in ``workdir/<name>.log``."""
    import httpx

    log = open(workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, str(script), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = clock() + timeout
    while clock() < deadline:
        if proc.poll() is not None:
            tail = (workdir / f"{name}.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the {name} exited with {proc.returncode}:\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return proc, url
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the {name} was not up after {timeout:.0f}s")


async def _usage(http: Any, upstream: str, max_tokens: int) -> int | None:
    """The answer streamed from the upstream; what its last event says it used (None: nothing)."""
    body = {"messages": [{"role": "user", "content": _PROMPT}], "max_tokens": max_tokens}
    used = None
    async with http.stream("POST", upstream + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    used = int(usage["total_tokens"])
    return used


async def chat_client(stack: Any, http: Any, tenant: ChatTenant, stop: asyncio.Event) -> None:
    """``tenant``'s requests until ``stop``: reserve, stream, settle (see the module docstring).
    ``stack`` is the demo's: its replicas' ``urls``, those ``down``, ``chat_url``, the
    ``sent`` count, ``using`` (a request in flight to a replica) and ``failed``."""
    import httpx

    home = sum(tenant.name.encode()) % len(stack.urls)
    estimate = len(_PROMPT) // 4 + tenant.max_tokens
    loop = asyncio.get_running_loop()
    due, i = loop.time(), 0
    while not stop.is_set():
        target = i % len(stack.urls) if tenant.spread else home
        i += 1
        if target not in stack.down:
            with stack.using(target):
                replica = stack.urls[target]
                try:
                    decide = {"route": "chat", "key": tenant.name, "estimate": estimate}
                    r = await http.post(replica + "/v1/decide", json=decide)
                    stack.sent += 1
                    rid = r.json().get("reservation") if r.status_code == 200 else None
                    if rid is not None:
                        used = await _usage(http, stack.chat_url, tenant.max_tokens)
                        if used is not None:
                            await http.post(replica + "/v1/settle", json={"reservation": rid, "cost": used})
                except (httpx.HTTPError, ValueError) as e:
                    stack.failed(e)
        due = max(due + 1.0 / tenant.rps, loop.time() - 1.0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, due - loop.time()))
