"""The TLS ports' metrics, read from their :class:`~.server.ServerTls` at each scrape
(which also looks at the certificate files, as a handshake does):

=====================================================  =======  =============================
rate_limit_tls_certificate_expiry_timestamp_seconds    gauge    port (the served
                                                                certificate's notAfter)
rate_limit_tls_reloads_total                           counter  port, result: ok, error (new
                                                                files refused, the old kept)
rate_limit_tls_reload_failing                          gauge    port (1 while the files on
                                                                disk are ones that were refused)
rate_limit_tls_clients_refused_total                   counter  port, reason: name (a client
                                                                certificate with none of the
                                                                accepted names)
=====================================================  =======  =============================
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .server import ServerTls

__all__ = ["TlsCollector"]


class TlsCollector:
    """A prometheus-client collector of the TLS ports (see the module docstring)."""

    def __init__(self, ports: Iterable[ServerTls]) -> None:
        self.ports = list(ports)

    def describe(self) -> list[Any]:
        return []  # collected only at scrape time (no look at the files on registration)

    def collect(self) -> Iterator[Any]:
        expiry = GaugeMetricFamily(
            "rate_limit_tls_certificate_expiry_timestamp_seconds",
            "When the certificate this port serves expires (Unix seconds).",
            labels=["port"],
        )
        reloads = CounterMetricFamily(
            "rate_limit_tls_reloads_total",
            "New certificate files loaded (ok) or refused, the old ones kept (error).",
            labels=["port", "result"],
        )
        failing = GaugeMetricFamily(
            "rate_limit_tls_reload_failing",
            "1 while the certificate files on disk are ones that could not be used (the old ones serve).",
            labels=["port"],
        )
        refused = CounterMetricFamily(
            "rate_limit_tls_clients_refused_total",
            "Connections closed right after their handshake: a client certificate with none of the accepted names.",
            labels=["port", "reason"],
        )
        for tls in self.ports:
            tls.maybe_reload()
            expiry.add_metric([tls.port], tls.certificate.not_after)
            for result, n in tls.reloads.items():
                reloads.add_metric([tls.port, result], n)
            failing.add_metric([tls.port], 1.0 if tls.failing else 0.0)
            refused.add_metric([tls.port, "name"], tls.refused_names)
        yield from (expiry, reloads, failing, refused)
