"""A small chat upstream for budgets counted in tokens: it streams each answer as server-sent
events, OpenAI style, and reports what it used in its last event (``usage``), the way an LLM API
does, so a gateway can reserve an estimate before the answer and settle the actual cost after it.

``POST /v1/chat/completions`` with ``{"messages": [{"content": ...}], "max_tokens": N}`` answers
``text/event-stream``: a chunk per few words, then ``{"choices": [], "usage": {"prompt_tokens",
"completion_tokens", "total_tokens"}}`` and ``[DONE]``. The prompt costs a token per 4
characters; the answer uses from a quarter of ``max_tokens`` to all of it, the same for the same
request (a hash of its text), so a replay of the same traffic costs the same.

Run it::

    python examples/chat_upstream.py --port 9200       # from the repository root
    uvicorn examples.chat_upstream:app --port 9200

``shadowlimit demo`` runs one for its ``chat`` route (examples/rules.yaml).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

__all__ = ["MAX_TOKENS", "app", "create_app", "main", "usage_of"]

#: the most an answer may ask for (``max_tokens``)
MAX_TOKENS = 32_768
#: the most characters a request's messages may hold
MAX_PROMPT_CHARS = 200_000


def usage_of(prompt: str, max_tokens: int) -> dict[str, int]:
    """What an answer to ``prompt`` uses: the prompt a token per 4 characters (at least one), the
    answer from a quarter of ``max_tokens`` to all of it, fixed by a hash of the request."""
    prompt_tokens = max(1, len(prompt) // 4)
    digest = int.from_bytes(hashlib.sha256(f"{max_tokens}:{prompt}".encode()).digest()[:4], "big")
    completion = max(1, max_tokens // 4 + digest % max(1, max_tokens - max_tokens // 4 + 1))
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _request(body: Any) -> tuple[str, int]:
    if not isinstance(body, dict):
        raise HTTPException(422, "the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HTTPException(422, "messages: a non-empty list of {role, content}")
    prompt = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    if len(prompt) > MAX_PROMPT_CHARS:
        raise HTTPException(413, f"messages: at most {MAX_PROMPT_CHARS} characters")
    max_tokens = body.get("max_tokens", 256)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_TOKENS:
        raise HTTPException(422, f"max_tokens: a whole number from 1 to {MAX_TOKENS}")
    return prompt, max_tokens


def create_app(*, chunk_tokens: int = 50, delay_s: float = 0.005) -> FastAPI:
    """The upstream: a chunk of ``chunk_tokens`` tokens every ``delay_s``, then the usage."""
    api = FastAPI(title="chat upstream (shadowlimit example)")

    @api.post("/v1/chat/completions")
    async def complete(request: Request) -> StreamingResponse:
        prompt, max_tokens = _request(await request.json())
        usage = usage_of(prompt, max_tokens)

        async def events() -> AsyncIterator[bytes]:
            left = usage["completion_tokens"]
            while left > 0:
                n = min(chunk_tokens, left)
                left -= n
                delta = {"choices": [{"index": 0, "delta": {"content": "lorem " * n}}]}
                yield b"data: " + json.dumps(delta).encode() + b"\n\n"
                await asyncio.sleep(delay_s)
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @api.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return api


app = create_app()


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9200)
    args = parser.parse_args(argv)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
