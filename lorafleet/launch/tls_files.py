"""Make a throw-away CA and the server and client certificates it signs, for local TLS.

For tests and ``lorafleet up --secure`` only: keys are written unencrypted (mode 0600)
into a directory the caller owns, which must never be checked in.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["LOCAL_HOSTS", "TlsFiles", "make_tls_files"]

LOCAL_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
VALID_DAYS: Final = 30


@dataclass(frozen=True, kw_only=True)
class TlsFiles:
    """Paths of a CA certificate and of the server and client pairs it signed."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_tls_files(
    directory: Path, *, hosts: Sequence[str] = LOCAL_HOSTS, client_name: str = "lorafleet"
) -> TlsFiles:
    """Write a new CA, a server certificate for ``hosts`` and a client certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"lorafleet local CA {directory.name}")]
    )
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(
        ca_cert=directory / "ca.crt",
        server_cert=directory / "server.crt",
        server_key=directory / "server.key",
        client_cert=directory / "client.crt",
        client_key=directory / "client.key",
    )
    _write_cert(files.ca_cert, ca_cert)
    _issue(files.server_cert, files.server_key, ca_cert, ca_key, hosts[0], hosts, server=True)
    _issue(files.client_cert, files.client_key, ca_cert, ca_key, client_name, (), server=False)
    return files


def _issue(
    cert_path: Path, key_path: Path, ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey,
    common_name: str, hosts: Sequence[str], *, server: bool,
) -> None:  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _builder(subject, ca_cert.subject, key.public_key()).add_extension(
        x509.ExtendedKeyUsage([usage, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
    _write_cert(cert_path, builder.sign(ca_key, hashes.SHA256()))
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _names(hosts: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
