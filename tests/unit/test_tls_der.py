"""The certificate reader of the TLS checks against openssl's own reading of the test PKI's
certificates, and against broken input: a ``ValueError`` (so a startup error naming the file),
never another exception."""

from __future__ import annotations

import calendar
import subprocess
import time
from pathlib import Path

import pytest

from control_plane.tls.der import decode_certificate, pem_certificates
from control_plane.tls.files import TlsFileError, server_context

NAMES = ("ca", "server", "client", "envoy-client", "other-ca", "expired-server", "wrong-host")


def _openssl(path: str, *args: str) -> str:
    return subprocess.run(["openssl", "x509", "-in", path, "-noout", *args], capture_output=True, text=True,
                          check=True, timeout=30).stdout  # fmt: skip


def _end(path: str) -> float:
    text = _openssl(path, "-enddate").strip().split("=", 1)[1]
    return float(calendar.timegm(time.strptime(text.replace("  ", " "), "%b %d %H:%M:%S %Y GMT")))


@pytest.mark.parametrize("name", NAMES)
def test_the_fields_are_openssls(test_pki, name):
    path = str(Path(test_pki.directory) / f"{name}.crt")
    (der,) = pem_certificates(Path(path).read_bytes())
    cert = decode_certificate(der)
    assert cert.not_after == _end(path)
    assert cert.not_before < cert.not_after or name == "expired-server"
    subject = _openssl(path, "-subject", "-nameopt", "RFC2253").strip().removeprefix("subject=")
    assert [f"CN={cn}" for cn in cert.common_names] == [subject]
    sans = _openssl(path, "-ext", "subjectAltName")
    expected = [n.strip().replace("IP Address:", "IP:") for n in sans.splitlines()[1:2][0].split(",")] if sans else []
    assert list(cert.alt_names) == [n.replace("IP:0:0:0:0:0:0:0:1", "IP:::1") for n in expected]
    assert cert.is_ca == ("CA:TRUE" in _openssl(path, "-ext", "basicConstraints"))


def test_broken_certificates_are_value_errors(test_pki):
    """Every truncation of a real certificate, and every byte of it set to values that change
    its structure (tags, long lengths, zero): a ValueError or a reading, nothing else."""
    (der,) = pem_certificates(Path(test_pki.server_cert).read_bytes())
    others = []
    for broken in [der[:cut] for cut in range(len(der))] + [
        der[:i] + bytes([v]) + der[i + 1 :] for i in range(len(der)) for v in (0, 1, 0x04, 0x30, 0x80, 0x84, 0xA3, 0xFF)
    ]:
        try:
            decode_certificate(broken)
        except ValueError:
            pass
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            others.append(f"{type(exc).__name__}: {exc}")
    assert others == []


def test_an_encrypted_key_is_said_and_never_prompts_for_a_password(test_pki, tmp_path):
    locked = tmp_path / "locked.key"
    subprocess.run(["openssl", "pkey", "-in", test_pki.server_key, "-aes256", "-passout", "pass:secret", "-out",
                    str(locked)], check=True, timeout=30, stdin=subprocess.DEVNULL)  # fmt: skip
    with pytest.raises(TlsFileError) as info:
        server_context(cert=("C", Path(test_pki.server_cert)), key=("K", locked), client_ca=None, alpn=())
    assert str(info.value) == f"K: {locked}: is encrypted; give the key unencrypted (a mounted Secret)"
