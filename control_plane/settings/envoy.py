"""The settings of Envoy's rate limit service (a part of the one settings object,
:class:`~control_plane.settings.Settings`, which inherits them).

envoyproxy/ratelimit's own variable names are accepted next to shadowlimit's, so a
deployment moved over keeps its environment: ``LIMIT_RESPONSE_HEADERS_ENABLED``,
``LIMIT_LIMIT_HEADER``, ``LIMIT_REMAINING_HEADER``, ``LIMIT_RESET_HEADER`` and
``NEAR_LIMIT_RATIO``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, field_validator, model_validator

__all__ = ["EnvoyHeaders", "EnvoySettings"]

#: an HTTP field name (RFC 9110's token)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
_OFF = frozenset({"", "off", "none", "false", "0"})


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names, *(n.lower() for n in names))


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvoyHeaders:
    """What Envoy's answers carry besides the statuses (built once from the settings)."""

    response: Literal["none", "peer", "draft"]
    limit: str
    remaining: str
    reset: str
    would_limit: str | None  # the upstream's request header, None: off
    near_limit_ratio: float
    deadline_margin_s: float = 0.006  # kept of the caller's deadline for the answer's way back
    max_calls: int = 4096  # calls in progress; more are refused RESOURCE_EXHAUSTED, counted


class EnvoySettings(BaseModel):
    """The Envoy and gRPC fields (see the module docstring)."""

    envoy_config: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_ENVOY_CONFIG"),
        description=(
            "envoyproxy/ratelimit configuration: a YAML file, or a directory of .yaml files;"
            " each limited descriptor becomes a route (hot reloaded)."
        ),
    )
    grpc_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        validation_alias=_env("SHADOWLIMIT_GRPC_PORT"),
        description=(
            "Serve Envoy's rate limit service (envoy.service.ratelimit.v3) over gRPC on this port,"
            " on SHADOWLIMIT_HOST; unset: no gRPC."
        ),
    )
    envoy_response_headers: Literal["none", "peer", "draft"] | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_ENVOY_RESPONSE_HEADERS"),
        description=(
            "Rate-limit headers in Envoy answers (response_headers_to_add): none (default, as envoyproxy/ratelimit;"
            " let Envoy's enable_x_ratelimit_headers add them), peer (LIMIT_*_HEADER names, as the peer with"
            " LIMIT_RESPONSE_HEADERS_ENABLED=true) or draft (RateLimit-Policy and RateLimit, as for HTTP)."
        ),
    )
    limit_response_headers_enabled: bool = Field(
        False,
        validation_alias=_env("LIMIT_RESPONSE_HEADERS_ENABLED"),
        description="envoyproxy/ratelimit's switch: true means SHADOWLIMIT_ENVOY_RESPONSE_HEADERS=peer when unset.",
    )
    envoy_limit_header: str = Field(
        "RateLimit-Limit",
        validation_alias=_env("SHADOWLIMIT_ENVOY_LIMIT_HEADER", "LIMIT_LIMIT_HEADER"),
        description="The limit header's name with SHADOWLIMIT_ENVOY_RESPONSE_HEADERS=peer.",
    )
    envoy_remaining_header: str = Field(
        "RateLimit-Remaining",
        validation_alias=_env("SHADOWLIMIT_ENVOY_REMAINING_HEADER", "LIMIT_REMAINING_HEADER"),
        description="The remaining header's name with SHADOWLIMIT_ENVOY_RESPONSE_HEADERS=peer.",
    )
    envoy_reset_header: str = Field(
        "RateLimit-Reset",
        validation_alias=_env("SHADOWLIMIT_ENVOY_RESET_HEADER", "LIMIT_RESET_HEADER"),
        description="The reset header's name (seconds until the window ends) with ...=peer.",
    )
    envoy_would_limit_header: str = Field(
        "x-shadowlimit-would-limit",
        validation_alias=_env("SHADOWLIMIT_ENVOY_WOULD_LIMIT_HEADER"),
        description=(
            "Request header for the upstream naming the routes in shadow (or outside a canary's share) whose global"
            " limit is over for this request; Envoy routes in shadow then ask Redis in the request path. off: none."
        ),
    )
    envoy_near_limit_ratio: float = Field(
        0.8,
        gt=0,
        le=1,
        validation_alias=_env("SHADOWLIMIT_ENVOY_NEAR_LIMIT_RATIO", "NEAR_LIMIT_RATIO"),
        description="Hits above this share of a limit count as near_limit in rate_limit_envoy_hits_total.",
    )

    envoy_deadline_margin_ms: float = Field(
        6.0,
        ge=0,
        le=1000,
        validation_alias=_env("SHADOWLIMIT_ENVOY_DEADLINE_MARGIN_MS"),
        description=(
            "Of the deadline Envoy sends (grpc-timeout: the filter's timeout, 20 ms by default), what is kept for"
            " the answer's way back, besides a tenth of it: Redis gets the rest, then the failure policy answers."
        ),
    )
    grpc_max_calls: int = Field(
        4096,
        ge=1,
        le=100_000,
        validation_alias=_env("SHADOWLIMIT_GRPC_MAX_CALLS"),
        description="gRPC calls in progress at once; more are refused at once (RESOURCE_EXHAUSTED, counted).",
    )

    grpc_max_connections: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        validation_alias=_env("SHADOWLIMIT_GRPC_MAX_CONNECTIONS"),
        description=(
            "gRPC connections open at once (at most half the open-files limit, the rest kept for HTTP, Redis and"
            " files). A connection past it takes the place of the one idle longest (idle a second or more), else"
            ' it is closed at once (rate_limit_grpc_protocol_errors_total{kind="connection_refused"}).'
        ),
    )
    grpc_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        le=86_400,
        validation_alias=_env("SHADOWLIMIT_GRPC_IDLE_TIMEOUT_S"),
        description="A gRPC connection without an open stream for this long is closed (GOAWAY, then closed).",
    )
    grpc_keepalive_s: float = Field(
        60.0,
        gt=0,
        le=86_400,
        validation_alias=_env("SHADOWLIMIT_GRPC_KEEPALIVE_S"),
        description=(
            "A PING is sent on a gRPC connection silent for this long; one unanswered for a third of it (at least"
            " 1 s, at most 20 s) closes the connection, as do answers held by the client's window that long."
        ),
    )
    grpc_reflection: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_GRPC_REFLECTION"),
        description=(
            "Serve gRPC server reflection (grpcurl list/describe); like every method but health, it needs the"
            " client token when SHADOWLIMIT_CLIENT_TOKEN is set."
        ),
    )

    @field_validator("envoy_config")
    @classmethod
    def _check_envoy_config(cls, v: Path | None) -> Path | None:
        if v is None or not str(v).strip():
            return None
        if not v.exists():
            raise ValueError(f"{v} does not exist (a file, or a directory of .yaml files)")
        return v

    @field_validator("envoy_limit_header", "envoy_remaining_header", "envoy_reset_header")
    @classmethod
    def _check_header_name(cls, v: str) -> str:
        v = v.strip()
        if not _TOKEN.fullmatch(v):
            raise ValueError(f"must be an HTTP header name (letters, digits, '-', ...), got {v!r}")
        return v

    @field_validator("envoy_would_limit_header")
    @classmethod
    def _check_would_limit(cls, v: str) -> str:
        v = v.strip()
        if v.lower() in _OFF:
            return "off"
        if not _TOKEN.fullmatch(v) or v.startswith(":"):
            raise ValueError(f"must be an HTTP header name, or off, got {v!r}")
        return v.lower()

    @model_validator(mode="after")
    def _check_distinct_names(self) -> EnvoySettings:
        names = [self.envoy_limit_header, self.envoy_remaining_header, self.envoy_reset_header]
        if len({n.lower() for n in names}) < 3:
            raise ValueError(
                "SHADOWLIMIT_ENVOY_LIMIT_HEADER, SHADOWLIMIT_ENVOY_REMAINING_HEADER and SHADOWLIMIT_ENVOY_RESET_HEADER"
                f" must be three different names, got {', '.join(names)}"
            )
        return self

    @property
    def envoy_headers(self) -> EnvoyHeaders:
        """The Envoy answers' header choices."""
        response = self.envoy_response_headers or ("peer" if self.limit_response_headers_enabled else "none")
        would = None if self.envoy_would_limit_header == "off" else self.envoy_would_limit_header
        return EnvoyHeaders(
            response=response,
            limit=self.envoy_limit_header,
            remaining=self.envoy_remaining_header,
            reset=self.envoy_reset_header,
            would_limit=would,
            near_limit_ratio=self.envoy_near_limit_ratio,
            deadline_margin_s=self.envoy_deadline_margin_ms / 1000,
            max_calls=self.grpc_max_calls,
        )
