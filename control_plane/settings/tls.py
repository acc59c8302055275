"""The settings of TLS on shadowlimit's own ports (a part of the one settings object,
:class:`~control_plane.settings.Settings`, which inherits them).

One certificate and key serve both ports (``SHADOWLIMIT_TLS_CERT_FILE``,
``SHADOWLIMIT_TLS_KEY_FILE``); the gRPC port may have its own pair
(``SHADOWLIMIT_GRPC_TLS_CERT_FILE``/``_KEY_FILE``, or envoyproxy/ratelimit's
``GRPC_SERVER_TLS_CERT``/``_KEY``). A client CA switches mutual TLS on: for both ports
(``SHADOWLIMIT_TLS_CLIENT_CA_FILE``) or one (``SHADOWLIMIT_HTTP_TLS_CLIENT_CA_FILE``,
``SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE`` or ``GRPC_CLIENT_TLS_CACERT``), with an optional list
of the certificate names accepted (``SHADOWLIMIT_TLS_CLIENT_NAMES`` and the per-port
``..._CLIENT_NAMES``, or ``GRPC_CLIENT_TLS_SAN``). docs/tls.md walks through it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, BaseModel, Field, field_validator

from ..tls.spec import Port, PortTls, certificate_name_problem, split_names

__all__ = ["Port", "PortTls", "TlsSettings"]


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names, *(n.lower() for n in names))


def _path(v: object) -> Path | None:
    if v is None or (isinstance(v, str | Path) and not str(v).strip()):
        return None
    return Path(str(v).strip())


class TlsSettings(BaseModel):
    """TLS on the HTTP and gRPC ports (see the module docstring)."""

    tls_cert_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_TLS_CERT_FILE"),
        description="PEM certificate (its chain after it) served on the HTTP port, and on gRPC unless it has its own.",
    )
    tls_key_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_TLS_KEY_FILE"),
        description="PEM private key of SHADOWLIMIT_TLS_CERT_FILE.",
    )
    grpc_tls_cert_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_GRPC_TLS_CERT_FILE", "GRPC_SERVER_TLS_CERT"),
        description="The gRPC port's own certificate (else SHADOWLIMIT_TLS_CERT_FILE's).",
    )
    grpc_tls_key_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_GRPC_TLS_KEY_FILE", "GRPC_SERVER_TLS_KEY"),
        description="PEM private key of SHADOWLIMIT_GRPC_TLS_CERT_FILE.",
    )
    tls_client_ca_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_TLS_CLIENT_CA_FILE"),
        description="Mutual TLS on both ports: clients need a certificate from this CA (PEM, one or more).",
    )
    http_tls_client_ca_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_HTTP_TLS_CLIENT_CA_FILE"),
        description="Mutual TLS on the HTTP port only, or with another CA than SHADOWLIMIT_TLS_CLIENT_CA_FILE's.",
    )
    grpc_tls_client_ca_file: Path | None = Field(
        None,
        validation_alias=_env("SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE", "GRPC_CLIENT_TLS_CACERT"),
        description="Mutual TLS on the gRPC port only, or with another CA than SHADOWLIMIT_TLS_CLIENT_CA_FILE's.",
    )
    tls_client_names: str = Field(
        "",
        validation_alias=_env("SHADOWLIMIT_TLS_CLIENT_NAMES"),
        description=(
            "Client certificate names accepted on both ports (DNS:x, URI:x, IP:x, email:x or CN=x;"
            " empty: any the CA signed)."
        ),
    )
    http_tls_client_names: str = Field(
        "", validation_alias=_env("SHADOWLIMIT_HTTP_TLS_CLIENT_NAMES"), description="The HTTP port's own list."
    )
    grpc_tls_client_names: str = Field(
        "",
        validation_alias=_env("SHADOWLIMIT_GRPC_TLS_CLIENT_NAMES", "GRPC_CLIENT_TLS_SAN"),
        description="The gRPC port's own list (envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN: one DNS name).",
    )
    grpc_tls: bool = Field(
        True,
        validation_alias=_env("SHADOWLIMIT_GRPC_TLS", "GRPC_SERVER_USE_TLS"),
        description=(
            "false: the gRPC port in cleartext though the HTTP port has TLS (beyond loopback it then"
            " needs SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE=true)."
        ),
    )
    tls_terminated_elsewhere: bool = Field(
        False,
        validation_alias=_env("SHADOWLIMIT_TLS_TERMINATED_ELSEWHERE"),
        description=(
            "A mesh or proxy in front terminates TLS: listen beyond loopback in cleartext"
            " (without it, a non-loopback SHADOWLIMIT_HOST needs SHADOWLIMIT_TLS_CERT_FILE)."
        ),
    )
    tls_reload_s: float = Field(
        2.0,
        ge=0.1,
        le=3600,
        validation_alias=_env("SHADOWLIMIT_TLS_RELOAD_S"),
        description="How often the certificate files are looked at for a new version (seconds).",
    )
    tls_handshake_timeout_s: float = Field(
        5.0,
        ge=0.1,
        le=120,
        validation_alias=_env("SHADOWLIMIT_TLS_HANDSHAKE_TIMEOUT_S"),
        description="A TLS handshake not done within this is cut (a client stalling mid-handshake).",
    )

    @field_validator(
        "tls_cert_file",
        "tls_key_file",
        "grpc_tls_cert_file",
        "grpc_tls_key_file",
        "tls_client_ca_file",
        "http_tls_client_ca_file",
        "grpc_tls_client_ca_file",
        mode="before",
    )
    @classmethod
    def _blank_is_none(cls, v: object) -> Path | None:
        return _path(v)

    @field_validator("tls_client_names", "http_tls_client_names", "grpc_tls_client_names")
    @classmethod
    def _check_names(cls, v: str) -> str:
        for name in split_names(v):
            problem = certificate_name_problem(name)
            if problem:
                raise ValueError(problem)
        return v

    def port_tls(self, port: Port) -> PortTls | None:
        """The TLS of ``port``, or None (cleartext). Which files pair up is checked by
        :func:`check_pairs`, at startup, so this only reads the settings."""
        if port == "grpc" and not self.grpc_tls:
            return None
        if port == "grpc" and self.grpc_tls_cert_file is not None and self.grpc_tls_key_file is not None:
            cert, key = self.grpc_tls_cert_file, self.grpc_tls_key_file
            cert_setting, key_setting = "SHADOWLIMIT_GRPC_TLS_CERT_FILE", "SHADOWLIMIT_GRPC_TLS_KEY_FILE"
        elif self.tls_cert_file is not None and self.tls_key_file is not None:
            cert, key = self.tls_cert_file, self.tls_key_file
            cert_setting, key_setting = "SHADOWLIMIT_TLS_CERT_FILE", "SHADOWLIMIT_TLS_KEY_FILE"
        else:
            return None
        own_ca = self.grpc_tls_client_ca_file if port == "grpc" else self.http_tls_client_ca_file
        own_names = self.grpc_tls_client_names if port == "grpc" else self.http_tls_client_names
        ca, ca_setting = (own_ca, f"SHADOWLIMIT_{port.upper()}_TLS_CLIENT_CA_FILE") if own_ca else (None, None)
        if ca is None and self.tls_client_ca_file is not None:
            ca, ca_setting = self.tls_client_ca_file, "SHADOWLIMIT_TLS_CLIENT_CA_FILE"
        return PortTls(
            port=port,
            cert_file=cert,
            key_file=key,
            cert_setting=cert_setting,
            key_setting=key_setting,
            client_ca_file=ca,
            client_ca_setting=ca_setting,
            client_names=split_names(own_names) or split_names(self.tls_client_names),
        )

    def check_pairs(self) -> None:
        """Each key has its certificate and each client CA or name list a port with TLS
        (a ``ValueError`` naming the setting otherwise)."""
        pairs = (
            ("SHADOWLIMIT_TLS_CERT_FILE", self.tls_cert_file, "SHADOWLIMIT_TLS_KEY_FILE", self.tls_key_file),
            (
                "SHADOWLIMIT_GRPC_TLS_CERT_FILE",
                self.grpc_tls_cert_file,
                "SHADOWLIMIT_GRPC_TLS_KEY_FILE",
                self.grpc_tls_key_file,
            ),
        )
        for cert_name, cert, key_name, key in pairs:
            if (cert is None) != (key is None):
                missing = key_name if key is None else cert_name
                raise ValueError(f"{missing}: needed with {cert_name if key is None else key_name} (a pair)")
        http, grpc = self.port_tls("http"), self.port_tls("grpc")
        needs = (
            ("SHADOWLIMIT_TLS_CLIENT_CA_FILE", self.tls_client_ca_file, http or grpc),
            ("SHADOWLIMIT_HTTP_TLS_CLIENT_CA_FILE", self.http_tls_client_ca_file, http),
            ("SHADOWLIMIT_GRPC_TLS_CLIENT_CA_FILE", self.grpc_tls_client_ca_file, grpc),
            (
                "SHADOWLIMIT_TLS_CLIENT_NAMES",
                self.tls_client_names.strip(),
                (http and http.mutual) or (grpc and grpc.mutual),
            ),
            ("SHADOWLIMIT_HTTP_TLS_CLIENT_NAMES", self.http_tls_client_names.strip(), http and http.mutual),
            ("SHADOWLIMIT_GRPC_TLS_CLIENT_NAMES", self.grpc_tls_client_names.strip(), grpc and grpc.mutual),
        )
        for name, value, port in needs:
            if value and not port:
                what = "a client CA" if name.endswith("_CA_FILE") else "names of client certificates"
                raise ValueError(
                    f"{name}: {what} for a port without {'TLS' if what == 'a client CA' else 'mutual TLS'}"
                    " (set SHADOWLIMIT_TLS_CERT_FILE and _KEY_FILE"
                    + (")" if what == "a client CA" else ", and a client CA)")
                )
