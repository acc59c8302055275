"""The one settings object: every environment variable, its default, its validation.

The rollout plan's variables (``ENABLE_DISTRIBUTED_RATE_LIMITING``, ``RATE_LIMIT_*``) keep their
names and defaults; shadowlimit's own start with
``SHADOWLIMIT_`` or ``RATE_LIMIT_``. An invalid value stops startup with a message
naming the variable (:func:`load_settings` raises :class:`SettingsError`).
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from limiter.keys import TrustedProxies
from limiter.resilience import FailurePolicy

from .envoy import EnvoySettings
from .errors import SettingsError
from .limits import RequestLimits
from .plans import PlanSettings
from .rollout import RolloutSettings
from .tls import TlsSettings

if TYPE_CHECKING:
    from limiter.connection import RedisConnection
    from limiter.redis_url import RedisTarget

    from ..decision.headers import HeaderStyle
    from ..external import BackendHosts

__all__ = ["Settings", "SettingsError", "load_settings"]


def _env(name: str) -> AliasChoices:
    return AliasChoices(name, name.lower())


class Settings(EnvoySettings, PlanSettings, RolloutSettings, TlsSettings, BaseSettings):
    """Configuration for the control plane, the middleware and the demo (Envoy's rate limit
    service's fields come from :class:`~control_plane.settings.envoy.EnvoySettings`, the
    rollout's -- gates, modes, clocks -- from :class:`~control_plane.settings.rollout.RolloutSettings`,
    TLS on its own ports from :class:`~control_plane.settings.tls.TlsSettings`)."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore", populate_by_name=True)

    # the feature flag and the default limit
    enable_distributed_rate_limiting: bool = Field(
        False,
        validation_alias=_env("ENABLE_DISTRIBUTED_RATE_LIMITING"),
        description="Global kill switch: off makes every route behave as mode off.",
    )
    redis_url: str | None = Field(
        None,
        validation_alias=_env("RATE_LIMIT_REDIS_URL"),
        description="Redis URL (required unless SHADOWLIMIT_EMBEDDED_REDIS / --embedded-redis).",
    )
    global_capacity: int = Field(
        60,
        ge=1,
        validation_alias=_env("RATE_LIMIT_GLOBAL_CAPACITY"),
        description="Burst of the default route's token bucket.",
    )
    global_refill_per_sec: float = Field(
        1.0,
        ge=0,
        validation_alias=_env("RATE_LIMIT_GLOBAL_REFILL_PER_SEC"),
        description="Refill of the default route (tokens per second; 0 = unlimited).",
    )
    rules_path: Path | None = Field(
        None, validation_alias=_env("RATE_LIMIT_RULES_PATH"), description="YAML rules file."
    )
    over_limit_cache_keys: int = Field(
        65_536,
        ge=0,
        le=10_000_000,
        validation_alias=_env("SHADOWLIMIT_OVER_LIMIT_CACHE_KEYS"),
        description="Keys found over their global limit (enforce) answered without Redis until they may pass; 0: off.",
    )
    # Redis failure handling
    failure_policy: FailurePolicy = Field(
        FailurePolicy.IN_MEMORY_FALLBACK, validation_alias=_env("RATE_LIMIT_FAILURE_POLICY")
    )
    failure_code: int = Field(429, ge=400, le=599, validation_alias=_env("RATE_LIMIT_FAILURE_CODE"))
    breaker_failure_threshold: int = Field(5, ge=1, validation_alias=_env("RATE_LIMIT_BREAKER_FAILURES"))
    redis_password_file: Path | None = Field(
        None,
        validation_alias=_env("RATE_LIMIT_REDIS_PASSWORD_FILE"),
        description="File holding the Redis password (a mounted secret); instead of a password in the URL.",
    )
    redis_tls_ca_certs: Path | None = Field(
        None, validation_alias=_env("RATE_LIMIT_REDIS_TLS_CA_CERTS"), description="CA bundle (URL: ssl_ca_certs)."
    )
    redis_tls_certfile: Path | None = Field(
        None,
        validation_alias=_env("RATE_LIMIT_REDIS_TLS_CERTFILE"),
        description="Client certificate for mutual TLS (URL: ssl_certfile).",
    )
    redis_tls_keyfile: Path | None = Field(
        None, validation_alias=_env("RATE_LIMIT_REDIS_TLS_KEYFILE"), description="Its key (URL: ssl_keyfile)."
    )
    redis_tls_cert_reqs: str | None = Field(
        None,
        pattern="^(required|optional|none)$",
        validation_alias=_env("RATE_LIMIT_REDIS_TLS_CERT_REQS"),
        description="required (default), optional or none (URL: ssl_cert_reqs).",
    )
    redis_tls_check_hostname: bool | None = Field(
        None,
        validation_alias=_env("RATE_LIMIT_REDIS_TLS_CHECK_HOSTNAME"),
        description="Check the server's name (default: when certificates are required; URL: ssl_check_hostname).",
    )
    authz_deny_status: int | None = Field(
        None,
        ge=400,
        le=499,
        validation_alias=_env("SHADOWLIMIT_AUTHZ_DENY_STATUS"),
        description="Status of every /v1/authz rejection (nginx auth_request: 403); default the route's.",
    )
    redis_connect_timeout_s: float = Field(1.0, gt=0, validation_alias=_env("RATE_LIMIT_REDIS_CONNECT_TIMEOUT"))
    redis_command_timeout_s: float = Field(0.25, gt=0, validation_alias=_env("RATE_LIMIT_REDIS_COMMAND_TIMEOUT"))
    time_source: str = Field("local", pattern="^(local|redis)$", validation_alias=_env("RATE_LIMIT_TIME_SOURCE"))
    state_format: str = Field(
        "auto",
        pattern="^(auto|1|2)$",
        validation_alias=_env("RATE_LIMIT_STATE_FORMAT"),
        description=(
            "How window keys are stored (docs/state-format.md): auto writes the compact form once every live "
            "replica reads it (the fleet's heartbeats), 1 the hash every release reads, 2 the compact form."
        ),
    )
    # service
    admin_token: SecretStr | None = Field(None, validation_alias=_env("SHADOWLIMIT_ADMIN_TOKEN"))
    admin_token_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_ADMIN_TOKEN_FILE"),
        description="A file holding the admin token (a mounted secret); instead of SHADOWLIMIT_ADMIN_TOKEN.",
    )
    client_token: SecretStr | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_CLIENT_TOKEN"),
        description="Optional bearer token guarding the decide endpoints.",
    )
    tokens_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_TOKENS_FILE"),
        description=(
            "Named tokens with roles: one 'name role sha256-of-token' per line (viewer, operator, admin);"
            " re-read on change."
        ),
    )
    open_reads: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_OPEN_READS"),
        description="With a tokens file, keep the read endpoints open (by default they need at least the viewer role).",
    )
    trusted_proxies: str = Field(
        "",
        validation_alias=_env("SHADOWLIMIT_TRUSTED_PROXIES"),
        description="Comma-separated CIDRs whose X-Forwarded-For is honoured.",
    )
    host: str = Field("127.0.0.1", validation_alias=_env("SHADOWLIMIT_HOST"))
    port: int = Field(8080, ge=0, le=65535, validation_alias=_env("SHADOWLIMIT_PORT"))
    allow_remote: bool = Field(
        False, validation_alias=_env("SHADOWLIMIT_ALLOW_REMOTE"), description="Must be true to listen beyond loopback."
    )
    namespace: str = Field(
        "shadowlimit", pattern=r"^[A-Za-z0-9_.-]{1,64}$", validation_alias=_env("SHADOWLIMIT_NAMESPACE")
    )
    instance_id: str | None = Field(None, validation_alias=_env("SHADOWLIMIT_INSTANCE_ID"))
    local_max_keys: int = Field(65_536, ge=1, validation_alias=_env("SHADOWLIMIT_LOCAL_MAX_KEYS"))
    # request size limits (control_plane/server/limits.py; docs/configuration.md explains the defaults)
    max_body_bytes: int = Field(
        32 * 1024 * 1024,
        ge=4096,
        le=1024**3,
        validation_alias=_env("SHADOWLIMIT_MAX_BODY_BYTES"),
        description=(
            "Largest request body; more gets 413 before (or while) it is read."
            " Fits a full 10,000-item batch at the schema's largest field sizes."
        ),
    )
    max_headers: int = Field(
        100,
        ge=16,
        le=10_000,
        validation_alias=_env("SHADOWLIMIT_MAX_HEADERS"),
        description="Most header fields in a request; more gets 431.",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        le=1024**2,
        validation_alias=_env("SHADOWLIMIT_MAX_HEADER_BYTES"),
        description="Largest total of header names and values in a request; more gets 431.",
    )
    header_timeout_s: float = Field(
        5.0,
        gt=0,
        le=300,
        validation_alias=_env("SHADOWLIMIT_HEADER_TIMEOUT_S"),
        description="Seconds a request head may take to arrive; then 408 and the connection is closed.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        validation_alias=_env("SHADOWLIMIT_LOG_FORMAT"),
        description="Log lines on stderr: text, or json (one object per line, events with their fields).",
    )
    # rate-limit response headers (control_plane/decision/headers.py; docs/api.md)
    headers: str = Field(
        "draft,legacy",
        validation_alias=_env("SHADOWLIMIT_HEADERS"),
        description=(
            "Rate-limit headers on decisions: draft (RateLimit-Policy, RateLimit), legacy (X-RateLimit-*),"
            " both, or none."
        ),
    )
    announce_shadow: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_ANNOUNCE_SHADOW"),
        description="Announce the coming distributed limit in shadow (an sl-shadow item naming <route>-global).",
    )
    reset_header: Literal["unix", "seconds"] = Field(
        "unix",
        validation_alias=_env("SHADOWLIMIT_RESET_HEADER"),
        description=(
            "X-RateLimit-Reset as a Unix time (unix) or in seconds from now (seconds, as Envoy and Kong send it)."
        ),
    )
    # shadow evaluation
    record: bool = Field(
        True,
        validation_alias=_env("SHADOWLIMIT_RECORD"),
        description="Record decided requests in Redis for what-if replays (POST /v1/whatif).",
    )
    record_budget: int = Field(
        20_000,
        ge=100,
        le=10_000_000,
        validation_alias=_env("SHADOWLIMIT_RECORD_BUDGET"),
        description="Recorded requests per route and minute, fleet-wide; above it whole keys are sampled.",
    )
    record_minutes: int = Field(
        30,
        ge=1,
        le=24 * 60,
        validation_alias=_env("SHADOWLIMIT_RECORD_MINUTES"),
        description="Minutes of recording kept (each minute's data expires after this).",
    )
    shadow_queue_size: int = Field(10_000, ge=1, validation_alias=_env("SHADOWLIMIT_SHADOW_QUEUE_SIZE"))
    shadow_batch_size: int = Field(256, ge=1, validation_alias=_env("SHADOWLIMIT_SHADOW_BATCH_SIZE"))
    shadow_linger_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        validation_alias=_env("SHADOWLIMIT_SHADOW_LINGER_MS"),
        description=(
            "How long the shadow worker waits for more requests before sending a batch that is not full"
            " (0: send at once)."
        ),
    )
    # state and readiness
    embedded_redis: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_EMBEDDED_REDIS"),
        description=(
            "Development only: with no RATE_LIMIT_REDIS_URL, start a private redis-server for this process"
            " (each process then has its own 'global' limit)."
        ),
    )
    audit_log: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_AUDIT_LOG"),
        description="Append every audit entry this replica writes to this file, one JSON line each.",
    )
    ready_requires_redis: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_READY_REQUIRES_REDIS"),
        description=(
            "/readyz answers 503 while Redis is unreachable (default: ready while the replica can decide,"
            " failure policies included)."
        ),
    )
    # the server process
    gc_tuning: bool = Field(
        True,
        validation_alias=_env("SHADOWLIMIT_GC_TUNING"),
        description=(
            "After startup, freeze the startup heap out of the garbage collector's way and raise the young-generation"
            " threshold, so full collections do not stall requests."
        ),
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        validation_alias=_env("SHADOWLIMIT_WORKERS"),
        description="Worker processes on the one port (SO_REUSEPORT), each a fleet instance; `serve --workers`.",
    )
    hot_path: bool = Field(
        True,
        validation_alias=_env("SHADOWLIMIT_HOT_PATH"),
        description=(
            "Answer plainly normal /v1/decide, /v1/decide/batch and /v1/authz requests in front of the framework"
            " (the same bytes, several times the throughput); false: every request through FastAPI."
        ),
    )
    metrics_max_routes: int = Field(
        1000,
        ge=1,
        validation_alias=_env("SHADOWLIMIT_METRICS_MAX_ROUTES"),
        description='Routes with series of their own in /metrics; the others\' counts go to route="(other)".',
    )
    otel: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_OTEL"),
        description=(
            "FastAPI's native OpenTelemetry instrumentation (spans, metrics, logs per request)"
            " for a process with an OpenTelemetry SDK configured."
        ),
    )
    # event stream
    stream_interval_s: float = Field(1.0, gt=0, le=60, validation_alias=_env("SHADOWLIMIT_STREAM_INTERVAL_S"))
    stream_min_interval_s: float = Field(
        0.5,
        gt=0,
        le=60,
        validation_alias=_env("SHADOWLIMIT_STREAM_MIN_INTERVAL_S"),
        description="Smallest ?interval= a stream may ask for (smaller: 422); also the floor of the default interval.",
    )
    max_streams: int = Field(
        64,
        ge=1,
        validation_alias=_env("SHADOWLIMIT_MAX_STREAMS"),
        description="Event streams one replica serves at once; beyond: 503 too_many_streams.",
    )
    stream_history: int = Field(
        1000,
        ge=1,
        le=100_000,
        validation_alias=_env("SHADOWLIMIT_STREAM_HISTORY"),
        description="Events kept for clients that reconnect with Last-Event-ID.",
    )
    rules_poll_interval_s: float = Field(1.0, gt=0, validation_alias=_env("SHADOWLIMIT_RULES_POLL_INTERVAL_S"))
    rollout_resync_s: float = Field(0.5, gt=0, validation_alias=_env("SHADOWLIMIT_ROLLOUT_RESYNC_S"))
    # external limits services (routes with an `external` block)
    external_backend_hosts: str = Field(
        "",
        validation_alias=_env("SHADOWLIMIT_EXTERNAL_BACKEND_HOSTS"),
        description=(
            "Comma-separated hosts (host, host:port, *.domain) a limits service's backend_url may point at;"
            " empty drops every backend_url."
        ),
    )

    @field_validator("failure_policy", mode="before")
    @classmethod
    def _parse_failure_policy(cls, v: object) -> FailurePolicy:
        return FailurePolicy.parse(v)  # type: ignore[arg-type]

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, v: str) -> str:
        from ..decision.headers import HeaderStyle

        HeaderStyle.parse(v)
        return v

    @field_validator("trusted_proxies")
    @classmethod
    def _check_proxies(cls, v: str) -> str:
        TrustedProxies.parse(v)
        return v

    @field_validator("external_backend_hosts")
    @classmethod
    def _check_backend_hosts(cls, v: str) -> str:
        from ..external import BackendHosts

        BackendHosts(v)
        return v

    @field_validator("redis_url")
    @classmethod
    def _check_url(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        from limiter.resp import parse_redis_url

        parse_redis_url(v)
        return v.strip()

    @field_validator("redis_password_file", "redis_tls_ca_certs", "redis_tls_certfile", "redis_tls_keyfile")
    @classmethod
    def _check_readable(cls, v: Path | None) -> Path | None:
        if v is None or not str(v).strip():
            return None
        if not v.is_file():
            raise ValueError(f"file {v} does not exist")
        try:
            v.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {v}: {exc.strerror}") from None
        return v

    @field_validator("rules_path")
    @classmethod
    def _check_rules(cls, v: Path | None) -> Path | None:
        if v is not None and str(v).strip() and not v.is_file():
            raise ValueError(f"file {v} does not exist")
        return v if v is not None and str(v).strip() else None

    @field_validator("tokens_file")
    @classmethod
    def _check_tokens_file(cls, v: Path | None) -> Path | None:
        if v is None or not str(v).strip():
            return None
        from ..auth import TokensFile

        TokensFile(v)
        return v

    @field_validator("audit_log")
    @classmethod
    def _check_audit_log(cls, v: Path | None) -> Path | None:
        if v is None or not str(v).strip():
            return None
        from ..observe.auditlog import check_audit_path

        check_audit_path(v)
        return v

    @model_validator(mode="after")
    def _check_listen(self) -> Settings:
        try:
            loopback = self.host == "localhost" or ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            raise ValueError(f"SHADOWLIMIT_HOST: not an IP address: {self.host!r}") from None
        if not loopback and not self.allow_remote:
            raise ValueError(
                f"SHADOWLIMIT_HOST: {self.host} is not a loopback address;"
                " set SHADOWLIMIT_ALLOW_REMOTE=true to listen beyond loopback"
            )
        self.check_pairs()
        if not loopback and not self.tls_terminated_elsewhere:
            for port, spec in (("HTTP", self.port_tls("http")), ("gRPC", self.port_tls("grpc"))):
                if spec is None and (port == "HTTP" or self.grpc_port is not None):
                    raise ValueError(
                        f"SHADOWLIMIT_HOST: {self.host} is beyond loopback and the {port} port has no TLS: set"
                        " SHADOWLIMIT_TLS_CERT_FILE and SHADOWLIMIT_TLS_KEY_FILE, or"
                        " SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE=true where a mesh or proxy in front terminates TLS"
                    )
        return self

    @model_validator(mode="after")
    def _read_admin_token_file(self) -> Settings:
        path = self.admin_token_file
        if path is None or not str(path).strip():
            return self
        if self.admin_token is not None:
            raise ValueError("SHADOWLIMIT_ADMIN_TOKEN_FILE: set it or SHADOWLIMIT_ADMIN_TOKEN, not both")
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"SHADOWLIMIT_ADMIN_TOKEN_FILE: cannot read {path}: {exc}") from None
        if not token:
            raise ValueError(f"SHADOWLIMIT_ADMIN_TOKEN_FILE: {path} is empty")
        self.admin_token = SecretStr(token)
        return self

    @model_validator(mode="after")
    def _check_grpc(self) -> Settings:
        if self.grpc_port is None:
            return self
        if self.envoy_config is None:
            raise ValueError(
                "SHADOWLIMIT_GRPC_PORT: Envoy's rate limit service needs its limits: set SHADOWLIMIT_ENVOY_CONFIG"
                " (an envoyproxy/ratelimit config file or directory)"
            )
        if not self.enable_distributed_rate_limiting:
            raise ValueError(
                "SHADOWLIMIT_GRPC_PORT: Envoy's limits are global: set ENABLE_DISTRIBUTED_RATE_LIMITING=true"
                " (with it false every route is off and each replica would count alone)"
            )
        if self.grpc_port and self.grpc_port == self.port:
            raise ValueError(f"SHADOWLIMIT_GRPC_PORT: {self.grpc_port} is SHADOWLIMIT_PORT too; use another port")
        return self

    @model_validator(mode="after")
    def _check_default_policy(self) -> Settings:
        """The default route's token bucket must be a valid policy (see limiter.policy's bounds)."""
        from limiter import Policy

        try:
            Policy(average=self.global_refill_per_sec, period=1.0, burst=self.global_capacity)
        except ValueError as exc:
            field, _, rest = str(exc).partition(": ")
            env = "RATE_LIMIT_GLOBAL_CAPACITY" if field == "burst" else "RATE_LIMIT_GLOBAL_REFILL_PER_SEC"
            raise ValueError(
                f"{env}: {rest} (the default route's token bucket:"
                f" RATE_LIMIT_GLOBAL_REFILL_PER_SEC={self.global_refill_per_sec:g},"
                f" RATE_LIMIT_GLOBAL_CAPACITY={self.global_capacity})"
            ) from None
        return self

    def redis_target(self, url: str) -> RedisTarget:
        """``url`` parsed, with the password file and the TLS settings applied; a
        contradiction between them and the URL is a :class:`SettingsError`."""
        from .redis import apply_redis_settings

        return apply_redis_settings(self, url)

    def redis_connection(self, url: str) -> RedisConnection:
        """The one description both clients are built from: :meth:`redis_target`, the timeouts."""
        from .redis import connection_of

        return connection_of(self, url)

    @property
    def proxies(self) -> TrustedProxies:
        return TrustedProxies.parse(self.trusted_proxies)

    @property
    def request_limits(self) -> RequestLimits:
        return RequestLimits(self.max_body_bytes, self.max_headers, self.max_header_bytes, self.header_timeout_s)

    def header_style(self) -> HeaderStyle:
        from ..decision.headers import HeaderStyle

        return HeaderStyle.parse(self.headers, announce_shadow=self.announce_shadow, reset=self.reset_header)

    @property
    def backend_hosts(self) -> BackendHosts:
        from ..external import BackendHosts

        return BackendHosts(self.external_backend_hosts)


_ENV_NAMES = {
    name: (f.validation_alias.choices[0] if isinstance(f.validation_alias, AliasChoices) else name)
    for name, f in Settings.model_fields.items()
}


_SECRET_FIELDS = frozenset({"redis_url", "admin_token", "client_token"})


def _secret_env() -> frozenset[str]:
    return frozenset(env_name(f) for f in _SECRET_FIELDS)


def env_name(field_name: str) -> str:
    return str(_ENV_NAMES.get(field_name, field_name.upper()))


_SECRET_ENV = _secret_env()


def load_settings(**overrides: object) -> Settings:
    """Read the environment (and overrides); raise :class:`SettingsError` naming the variable."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = err.get("loc") or ()
            field = str(loc[0]) if loc else ""
            msg = err.get("msg", "invalid")
            msg = msg.removeprefix("Value error, ")
            if field:
                secret = env_name(field) in _SECRET_ENV  # never echo a URL that may hold a password
                got = f" (got {err.get('input')!r})" if "got " not in msg and not secret else ""
                lines.append(f"{env_name(field)}: {msg}{got}")
            else:
                lines.append(msg)
        raise SettingsError("invalid configuration:\n  " + "\n  ".join(lines)) from None
