"""The dashboard's one client for the control plane: HTTP (httpx, async) and the SSE stream.

It speaks only HTTP, so the dashboard works against a remote control plane too; it never
imports the control plane. Errors are translated here, once::

    ClientError
    ├── ControlPlaneUnavailable   cannot connect, timed out, stream broke, or 503
    └── ApiError(status, error, message)
        ├── Unauthorized          401 / 403: missing or wrong token, too small a role, none configured
        └── GateRefused(gate)     409 gate_failed: the promotion gate said no (a mode's or a candidate's)

Usage::

    client = ControlPlaneClient("http://127.0.0.1:8080", token="...")
    async for item in client.stream(route="search"):
        ...  # Snapshot or EventView
    await client.aclose()
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx

from .models import (
    AuditEntryView,
    BackendView,
    BucketView,
    CandidateChange,
    DivergenceView,
    EventView,
    ExternalView,
    GateView,
    ModeChangeResult,
    PlanChange,
    RouteView,
    Snapshot,
    WhatIfView,
)

__all__ = [
    "ApiError",
    "AuditEntryView",
    "BackendView",
    "BucketView",
    "CandidateChange",
    "ClientError",
    "ControlPlaneClient",
    "ControlPlaneUnavailable",
    "DivergenceView",
    "EventView",
    "ExternalView",
    "GateRefused",
    "ModeChangeResult",
    "RouteView",
    "Snapshot",
    "SseMessage",
    "Unauthorized",
    "parse_sse",
]

#: Snapshots arrive about every second; this long without a byte means the stream is dead.
STREAM_READ_TIMEOUT_S = 5.0  # snapshots come every ~1 s: five missing ones mean the stream is stale


class ClientError(Exception):
    """Anything that went wrong talking to the control plane."""


class ControlPlaneUnavailable(ClientError):
    """The control plane (or its Redis, on a 503) could not be reached."""


class ApiError(ClientError):
    """The control plane answered with an error body ``{"error", "message", ...}``."""

    def __init__(self, status: int, error: str, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(f"{status} {error}: {message}")
        self.status = status
        self.error = error
        self.message = message
        self.body = body or {}
        #: the request field the server named (``limit``, ``burst``, ``route`` ...), or None
        self.field: str | None = str(self.body["field"]) if self.body.get("field") else None

    def explain(self) -> str:
        """``422 invalid_request: limit: equal to the route's current limit (...)``: the status,
        the error and the message, naming the field when the message does not already."""
        named = self.field is None or self.message.startswith(f"{self.field}:")
        return f"{self.status} {self.error}: " + (self.message if named else f"{self.field}: {self.message}")


class Unauthorized(ApiError):
    """401/403: the token is missing, wrong, has too small a role (403 ``forbidden`` names
    the role needed), or the server has none configured."""


class GateRefused(ApiError):
    """409: the promotion gate refused; ``gate`` holds its reasons and figures."""

    def __init__(
        self, gate: GateView, message: str = "promotion refused by the gate", body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(409, "gate_failed", message, body)
        self.gate = gate


def _error_from(resp: httpx.Response) -> ClientError:
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    error = str(body.get("error") or "http_error")
    message = str(body.get("message") or resp.reason_phrase or f"HTTP {resp.status_code}")
    if resp.status_code in (401, 403):
        return Unauthorized(resp.status_code, error, message, body)
    if resp.status_code == 409 and error == "gate_failed":
        gate = GateView.parse(body.get("gate")) or GateView(passed=False, required=True, reasons=(message,))
        return GateRefused(gate, message, body)
    if resp.status_code in (502, 503, 504):
        return ControlPlaneUnavailable(f"{resp.status_code} {error}: {message}")
    return ApiError(resp.status_code, error, message, body)


class SseMessage(NamedTuple):
    """One SSE message: its event name, its data, and its ``id:`` (``None`` without one)."""

    event: str
    data: str
    id: str | None = None


def parse_sse(lines: list[str]) -> SseMessage | None:
    """One SSE message's lines (without the blank terminator) -> :class:`SseMessage`;
    ``None`` for messages without data (``retry:``, comments)."""
    event = "message"
    data: list[str] = []
    event_id: str | None = None
    for line in lines:
        if not line or line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            event_id = value
    return SseMessage(event, "\n".join(data), event_id) if data else None


class ControlPlaneClient:
    """Async HTTP client for one control-plane replica (its URL and optional admin token)."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        timeout: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.tls = tls  # an https:// URL's CA bundle and client certificate (None: the system's CAs)
        self.token = token or None
        self._timeout = timeout
        self._transport = transport
        self._http: httpx.AsyncClient | None = None
        #: the id of the last stream event received; sent as ``Last-Event-ID`` when the
        #: stream is opened again, so the events missed in between come first
        self.last_event_id: str | None = None

    @property
    def has_token(self) -> bool:
        return self.token is not None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            # the token goes with every request: a viewer token is enough for watching (a
            # control plane with a tokens file needs one for its read endpoints), an
            # operator token also changes modes
            headers = {"X-Shadowlimit-Actor": "dashboard"} | (
                {"Authorization": f"Bearer {self.token}"} if self.token else {}
            )
            self._http = httpx.AsyncClient(
                base_url=self.url,
                timeout=self._timeout,
                transport=self._transport,
                headers=headers,
                verify=self.tls if self.tls is not None else True,
                # an idle connection retired before the control plane's 5 s keep-alive closes it
                limits=httpx.Limits(keepalive_expiry=2.0),
            )
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            await http.aclose()

    async def _request(self, method: str, path: str, *, params: dict[str, Any] | None = None, body: Any = None) -> Any:
        try:
            resp = await self._client().request(method, path, params=params, json=body)
        except httpx.HTTPError as exc:
            raise ControlPlaneUnavailable(f"{self.url}: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
        if resp.status_code >= 400:
            raise _error_from(resp)
        try:
            return resp.json()
        except ValueError as exc:
            raise ApiError(resp.status_code, "bad_response", f"not JSON: {resp.text[:200]!r}") from exc

    # -- reads ---------------------------------------------------------------------------

    async def routes(self) -> list[RouteView]:
        data = await self._request("GET", "/v1/routes")
        return [RouteView.parse(r) for r in data.get("routes") or ()]

    async def buckets(self, route: str | None = None, limit: int = 20) -> list[BucketView]:
        params: dict[str, Any] = {"limit": limit} | ({"route": route} if route else {})
        data = await self._request("GET", "/v1/buckets", params=params)
        return [BucketView.parse(b) for b in data.get("buckets") or ()]

    async def backend(self) -> BackendView:
        return BackendView.parse(await self._request("GET", "/v1/backend"))

    async def external(self) -> ExternalView | None:
        """Routes with external limits: per-key breakers, cache and call figures."""
        return ExternalView.parse(await self._request("GET", "/v1/external"))

    async def divergence(self, minutes: int = 60) -> DivergenceView | None:
        return DivergenceView.parse(await self._request("GET", "/v1/divergence", params={"minutes": minutes}))

    async def audit(self, limit: int = 50, route: str | None = None) -> list[AuditEntryView]:
        params: dict[str, Any] = {"limit": limit} | ({"route": route} if route else {})
        data = await self._request("GET", "/v1/rollout/audit", params=params)
        return [AuditEntryView.parse(e) for e in data.get("entries") or ()]

    # -- changing a route's mode ---------------------------------------------------------------

    async def set_mode(
        self, route: str, mode: str, *, canary_percent: int = 0, reason: str, force: bool = False
    ) -> ModeChangeResult:
        """``PUT /v1/routes/{route}/mode``; raises :class:`GateRefused`, :class:`Unauthorized`,
        :class:`ControlPlaneUnavailable` or :class:`ApiError`."""
        if not self.token:
            raise Unauthorized(
                401,
                "unauthorized",
                "changing a route's mode needs a token with the operator role (--token or SHADOWLIMIT_ADMIN_TOKEN)",
            )
        body = {
            "mode": mode,
            "canary_percent": canary_percent if mode == "canary" else 0,
            "reason": reason,
            "force": force,
        }
        data = await self._request("PUT", f"/v1/routes/{quote(route, safe='')}/mode", body=body)
        return ModeChangeResult.parse(data)

    # -- what-if (a read) and applying its candidate (a change) ---------------------------------

    async def whatif(self, route: str, policy: dict[str, Any], minutes: int = 15) -> WhatIfView:
        """``POST /v1/whatif``: the route's recorded traffic replayed against ``policy``."""
        data = await self._request("POST", "/v1/whatif", body={"route": route, "policy": policy, "minutes": minutes})
        return WhatIfView.parse(data)

    async def adjust(self, route: str, policy: dict[str, Any], *, reason: str) -> None:
        """``PUT /ratelimit/config``: make ``policy`` the route's distributed limit (audited)."""
        if not self.token:
            raise Unauthorized(401, "unauthorized", "adjusting a limit needs a token with the operator role (--token)")
        body = {"route": route, "target": "distributed", "reason": reason, **policy}
        await self._request("PUT", "/ratelimit/config", body=body)

    # -- candidate limits: set one in shadow beside the current limit, drop it, promote it ------

    def _operator(self, what: str) -> None:
        if not self.token:
            raise Unauthorized(401, "unauthorized", f"{what} needs a token with the operator role (--token)")

    def _candidate_path(self, route: str) -> str:
        return f"/v1/routes/{quote(route, safe='')}/candidate"

    async def set_candidate(
        self, route: str, limit: str, *, reason: str, burst: int | None = None, algorithm: str | None = None
    ) -> CandidateChange:
        """``PUT /v1/routes/{route}/candidate``: evaluate ``limit`` (``"20/1s"``, ``"100/minute"``)
        in shadow beside the route's global limit (``algorithm``: default the route's). A 422
        :class:`ApiError` names the field in ``body["field"]`` (a limit equal to the current one,
        a route that is off, a limit the rules would refuse); 404 for an unknown route."""
        self._operator("setting a candidate limit")
        body: dict[str, Any] = {"limit": limit, "reason": reason}
        if burst is not None:
            body["burst"] = burst
        if algorithm is not None:
            body["algorithm"] = algorithm
        return CandidateChange.parse(await self._request("PUT", self._candidate_path(route), body=body))

    async def drop_candidate(self, route: str, *, reason: str) -> CandidateChange:
        """``DELETE /v1/routes/{route}/candidate`` (a 404 ``no_candidate`` when it has none)."""
        self._operator("dropping a candidate limit")
        return CandidateChange.parse(
            await self._request("DELETE", self._candidate_path(route), body={"reason": reason})
        )

    async def promote_candidate(self, route: str, *, reason: str, force: bool = False) -> CandidateChange:
        """``POST /v1/routes/{route}/candidate/promote``: the candidate becomes the route's global
        limit; raises :class:`GateRefused` with the gate's reasons unless ``force``."""
        self._operator("promoting a candidate limit")
        body = {"reason": reason, "force": force}
        return CandidateChange.parse(await self._request("POST", self._candidate_path(route) + "/promote", body=body))

    # -- the live stream -----------------------------------------------------------------

    # -- rollout plans: the operator's word ----------------------------------------------------

    async def plan_action(self, route: str, action: str, *, reason: str) -> PlanChange:
        """``POST /v1/routes/{route}/plan/{action}`` (``pause``, ``resume``, ``approve``, ``abort``);
        a plan in another state is a 409 :class:`ApiError` saying why."""
        self._operator(f"the plan's {action}")
        data = await self._request("POST", f"/v1/routes/{quote(route, safe='')}/plan/{action}", body={"reason": reason})
        return PlanChange.parse(data)

    async def stream(self, route: str | None = None, minutes: int = 60) -> AsyncIterator[Snapshot | EventView]:
        """Yield :class:`Snapshot` and :class:`EventView` items from ``GET /v1/stream`` until
        the stream breaks (raises :class:`ControlPlaneUnavailable`). Reconnecting is the
        caller's job: calling this again resumes after :attr:`last_event_id`."""
        params: dict[str, Any] = {"minutes": minutes} | ({"route": route} if route else {})
        timeout = httpx.Timeout(self._timeout, read=STREAM_READ_TIMEOUT_S)
        headers = {"Accept": "text/event-stream"} | (
            {"Last-Event-ID": self.last_event_id} if self.last_event_id else {}
        )
        try:
            async with self._client().stream(
                "GET", "/v1/stream", params=params, timeout=timeout, headers=headers
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise _error_from(resp)
                lines: list[str] = []
                async for line in resp.aiter_lines():
                    if line:
                        lines.append(line)
                        continue
                    msg, lines = parse_sse(lines), []
                    if msg is None:
                        continue
                    if msg.id is not None:
                        self.last_event_id = msg.id or None  # an empty id resets it (as in EventSource)
                    item = _decode(msg.event, msg.data)
                    if item is not None:
                        yield item
        except httpx.HTTPError as exc:
            raise ControlPlaneUnavailable(f"stream broke: {type(exc).__name__}: {exc}".rstrip(": ")) from exc
        raise ControlPlaneUnavailable("the server ended the stream")


def _decode(event: str, data: str) -> Snapshot | EventView | None:
    try:
        payload = json.loads(data)
    except ValueError:
        return None
    if event == "snapshot":
        return Snapshot.parse(payload)
    if event == "event":
        return EventView.parse(payload)
    return None
