"""The image's health check (``python3 -m control_plane.server.healthcheck``): ``GET /healthz``
on this container's own port, over HTTPS when the port serves TLS. It dials 127.0.0.1 and so
checks that something answers, not whose certificate it is; with mutual TLS on the HTTP port
it presents the server's own pair, which then must be a client certificate of the client CA
too (docs/tls.md#health-checks). Exit 0 when healthy, 1 otherwise, one line on stderr why."""

from __future__ import annotations

import os
import ssl
import sys
import urllib.request

__all__ = ["main"]


def main() -> int:
    port = os.environ.get("SHADOWLIMIT_PORT", "8080")
    cert, key = os.environ.get("SHADOWLIMIT_TLS_CERT_FILE", ""), os.environ.get("SHADOWLIMIT_TLS_KEY_FILE", "")
    context = None
    scheme = "https" if cert.strip() and key.strip() else "http"
    try:
        if scheme == "https":
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE  # this container's own loopback port
            env = os.environ
            if env.get("SHADOWLIMIT_HTTP_TLS_CLIENT_CA_FILE") or env.get("SHADOWLIMIT_TLS_CLIENT_CA_FILE"):
                context.load_cert_chain(cert, key)
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/healthz", timeout=2, context=context) as r:
            return 0 if r.status == 200 else 1
    except (OSError, ssl.SSLError) as exc:
        print(f"unhealthy: {scheme}://127.0.0.1:{port}/healthz: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
