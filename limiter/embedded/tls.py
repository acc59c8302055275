"""TLS for the embedded servers: :class:`TlsServerConfig` and a throw-away test PKI.

:func:`make_test_pki` writes a short-lived certificate authority and certificates
signed by it into a directory, using the ``openssl`` command-line tool (no Python
crypto dependency):

* ``ca``: the test CA every embedded server and client trusts;
* ``server``: SAN ``IP:127.0.0.1, IP:::1, DNS:localhost``, usable for both ends of a
  TLS link (``serverAuth`` + ``clientAuth``: Redis presents it when it connects to a
  master, a cluster peer or a sentinel);
* ``client``: a client certificate for mutual TLS;
* ``other_ca`` / ``other_server``: an unrelated CA and a server certificate it signed
  (a client trusting ``ca`` must refuse it);
* ``wrong_host``: signed by ``ca`` but for ``DNS:wrong.example`` only (a client that
  checks host names must refuse it on 127.0.0.1).

Keys are EC P-256 and certificates valid for two days; a directory that already
holds a complete, unexpired set is reused as is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .process import EmbeddedRedisError

__all__ = ["ClientAuth", "TestPki", "TlsServerConfig", "find_openssl", "make_test_pki"]

ClientAuth = Literal["yes", "no", "optional"]
"""``tls-auth-clients``: require, ignore or accept-but-not-require client certificates."""

PKI_VALID_DAYS = 2
_MARKER = "pki.ok"  # written last; holds the expiry (unix seconds) of the set
_OPENSSL_TIMEOUT = 30.0

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = unused

[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = IP:127.0.0.1, IP:::1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer

[client_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer

[envoy_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:envoy.internal
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer

[wrong_host_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth, clientAuth
subjectAltName = DNS:wrong.example
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


@dataclass(frozen=True, kw_only=True)
class TlsServerConfig:
    """How an embedded server serves TLS (and how the launcher's own clients connect).

    Args:
        cert_file / key_file: the server's certificate and key (``tls-cert-file`` /
            ``tls-key-file``). Redis also presents them when it connects out (to a
            master, a cluster peer, another sentinel), so under mutual TLS they must
            be valid client certificates too.
        ca_cert_file: the CA that client certificates (and peers) must chain to, and
            that the launcher's clients trust (``tls-ca-cert-file``, ``ssl_ca_certs``).
        client_auth: ``tls-auth-clients``: ``"yes"`` (mutual TLS), ``"no"``, ``"optional"``.
        client_cert_file / client_key_file: what the launcher's clients (readiness
            probes, :meth:`~limiter.embedded.EmbeddedRedis.client`) present; default:
            ``cert_file`` / ``key_file``.
        check_hostname: whether the launcher's clients check that the server
            certificate names the address they dial (only a deliberately mismatched
            test certificate needs ``False``).
    """

    cert_file: str
    key_file: str
    ca_cert_file: str
    client_auth: ClientAuth = "no"
    client_cert_file: str | None = None
    client_key_file: str | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.client_auth not in ("yes", "no", "optional"):
            raise EmbeddedRedisError(f"client_auth must be 'yes', 'no' or 'optional', got {self.client_auth!r}")
        if (self.client_cert_file is None) != (self.client_key_file is None):
            raise EmbeddedRedisError("client_cert_file and client_key_file go together")
        for path in (self.cert_file, self.key_file, self.ca_cert_file, self.client_cert_file, self.client_key_file):
            if path is not None and not os.path.isfile(path):
                raise EmbeddedRedisError(f"TLS file {path!r} does not exist")

    def client_kwargs(self) -> dict[str, Any]:
        """redis-py keyword arguments for a verified TLS connection to such a server."""
        return {
            "ssl": True,
            "ssl_ca_certs": self.ca_cert_file,
            "ssl_certfile": self.client_cert_file or self.cert_file,
            "ssl_keyfile": self.client_key_file or self.key_file,
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": self.check_hostname,
        }

    def server_lines(self) -> list[tuple[str, str]]:
        """``redis.conf`` directives for the certificates (the port is the caller's)."""
        return [
            ("tls-cert-file", self.cert_file),
            ("tls-key-file", self.key_file),
            ("tls-ca-cert-file", self.ca_cert_file),
            ("tls-auth-clients", self.client_auth),
        ]


@dataclass(frozen=True, kw_only=True)
class TestPki:
    """Paths of the files :func:`make_test_pki` wrote (PEM; keys are EC P-256)."""

    __test__ = False  # not a pytest test class despite the name

    directory: str
    ca_cert: str
    ca_key: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca_cert: str
    other_ca_key: str
    other_server_cert: str
    other_server_key: str
    wrong_host_cert: str
    wrong_host_key: str
    #: a client certificate named ``DNS:envoy.internal`` (and ``CN=envoy``), from ``ca``
    envoy_client_cert: str
    envoy_client_key: str
    #: a client certificate from the unrelated CA (``CN=stranger``)
    other_client_cert: str
    other_client_key: str
    #: a server certificate from ``ca`` that expired a day ago
    expired_server_cert: str
    expired_server_key: str

    def server_config(self, client_auth: ClientAuth = "no") -> TlsServerConfig:
        """A :class:`TlsServerConfig` serving ``server`` and trusting ``ca``; the launcher's
        own clients present ``client`` (so mutual TLS works out of the box)."""
        return TlsServerConfig(
            cert_file=self.server_cert,
            key_file=self.server_key,
            ca_cert_file=self.ca_cert,
            client_auth=client_auth,
            client_cert_file=self.client_cert,
            client_key_file=self.client_key,
        )


def find_openssl() -> str:
    """Path of the ``openssl`` binary, or :class:`EmbeddedRedisError` saying how to get one."""
    path = shutil.which("openssl")
    if path is None:
        raise EmbeddedRedisError(
            "no openssl binary on PATH (needed to make test certificates): `apt-get install openssl`"
        )
    return path


def _paths(directory: str) -> TestPki:
    def pair(name: str) -> tuple[str, str]:
        return os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")

    ca, ca_key = pair("ca")
    server, server_key = pair("server")
    client, client_key = pair("client")
    other_ca, other_ca_key = pair("other-ca")
    other_server, other_server_key = pair("other-server")
    wrong, wrong_key = pair("wrong-host")
    envoy, envoy_key = pair("envoy-client")
    other_client, other_client_key = pair("other-client")
    expired, expired_key = pair("expired-server")
    return TestPki(
        directory=directory, ca_cert=ca, ca_key=ca_key, server_cert=server, server_key=server_key,
        client_cert=client, client_key=client_key, other_ca_cert=other_ca, other_ca_key=other_ca_key,
        other_server_cert=other_server, other_server_key=other_server_key, wrong_host_cert=wrong,
        wrong_host_key=wrong_key, envoy_client_cert=envoy, envoy_client_key=envoy_key,
        other_client_cert=other_client, other_client_key=other_client_key, expired_server_cert=expired,
        expired_server_key=expired_key,
    )  # fmt: skip


def _complete(pki: TestPki) -> bool:
    """Whether ``pki``'s directory holds a finished set valid for at least another hour."""
    try:
        with open(os.path.join(pki.directory, _MARKER), encoding="ascii") as fh:
            expires = float(fh.read().strip())
    except (OSError, ValueError):
        return False
    files = [getattr(pki, name) for name in pki.__dataclass_fields__ if name != "directory"]
    return expires - time.time() > 3600 and all(os.path.isfile(path) for path in files)


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    """Serialise generation in ``directory`` across processes (pytest-xdist workers)."""
    with open(os.path.join(directory, ".lock"), "w", encoding="ascii") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class _OpenSsl:
    """Runs ``openssl`` subcommands in one directory, turning failures into clear errors."""

    def __init__(self, directory: str) -> None:
        self.binary = find_openssl()
        self.directory = directory
        self.config = os.path.join(directory, "openssl.cnf")
        with open(self.config, "w", encoding="ascii") as fh:
            fh.write(_OPENSSL_CONFIG)

    def run(self, *args: str) -> None:
        argv = [self.binary, *args]
        try:
            done = subprocess.run(
                argv, cwd=self.directory, capture_output=True, text=True, timeout=_OPENSSL_TIMEOUT, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmbeddedRedisError(f"could not run {' '.join(argv)}: {exc}") from exc
        if done.returncode != 0:
            raise EmbeddedRedisError(
                f"openssl {args[0]} failed with status {done.returncode}: {' '.join(argv)}\n"
                f"{(done.stderr or done.stdout).strip()}"
            )

    def key(self, path: str) -> None:
        self.run("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path)
        os.chmod(path, 0o600)

    def ca(self, cert: str, key: str, name: str) -> None:
        self.key(key)
        self.run(
            "req", "-config", self.config, "-x509", "-new", "-key", key, "-sha256", "-days", str(PKI_VALID_DAYS),
            "-subj", f"/CN={name}", "-extensions", "ca_ext", "-set_serial", _serial(), "-out", cert,
        )  # fmt: skip

    def leaf(self, cert: str, key: str, name: str, ca: tuple[str, str], extensions: str, days: int = 0) -> None:
        """A certificate signed by ``ca``, valid for ``days`` (0: the set's days; -1: it
        expired a day ago)."""
        self.key(key)
        csr = cert + ".csr"
        self.run("req", "-config", self.config, "-new", "-key", key, "-subj", f"/CN={name}", "-out", csr)
        self.run(
            "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-set_serial", _serial(), "-sha256",
            "-days", str(days or PKI_VALID_DAYS), "-extfile", self.config, "-extensions", extensions, "-out", cert,
        )  # fmt: skip
        os.unlink(csr)


def _serial() -> str:
    return "0x" + secrets.token_hex(16)


def make_test_pki(directory: str | os.PathLike[str]) -> TestPki:
    """Create (or reuse) a test PKI in ``directory`` and return the paths.

    Idempotent: a directory that already holds a complete set valid for at least
    another hour is returned untouched; otherwise everything is generated afresh
    (safe against concurrent callers on the same directory).

    Raises:
        EmbeddedRedisError: no ``openssl`` binary, or an ``openssl`` command failed
            (the message carries its stderr).
    """
    path = os.path.abspath(os.fspath(directory))
    os.makedirs(path, exist_ok=True)
    pki = _paths(path)
    if _complete(pki):
        return pki
    with _locked(path):
        if _complete(pki):
            return pki
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(path, _MARKER))
        tool = _OpenSsl(path)
        good = (pki.ca_cert, pki.ca_key)
        tool.ca(pki.ca_cert, pki.ca_key, "shadowlimit test CA")
        tool.leaf(pki.server_cert, pki.server_key, "localhost", good, "server_ext")
        tool.leaf(pki.client_cert, pki.client_key, "shadowlimit test client", good, "client_ext")
        tool.leaf(pki.wrong_host_cert, pki.wrong_host_key, "wrong.example", good, "wrong_host_ext")
        tool.ca(pki.other_ca_cert, pki.other_ca_key, "unrelated test CA")
        other = (pki.other_ca_cert, pki.other_ca_key)
        tool.leaf(pki.other_server_cert, pki.other_server_key, "localhost", other, "server_ext")
        tool.leaf(pki.envoy_client_cert, pki.envoy_client_key, "envoy", good, "envoy_ext")
        tool.leaf(pki.other_client_cert, pki.other_client_key, "stranger", other, "client_ext")
        tool.leaf(pki.expired_server_cert, pki.expired_server_key, "localhost", good, "server_ext", days=-1)
        expires = time.time() + PKI_VALID_DAYS * 86400 - 300
        with open(os.path.join(path, _MARKER), "w", encoding="ascii") as fh:
            fh.write(f"{expires:.0f}\n")
    return pki
