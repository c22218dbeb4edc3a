"""A throwaway certificate authority for tests: a CA, a server certificate for 127.0.0.1 and
a client certificate, as PEM files (the ``cryptography`` package)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def make_certs(directory: Path) -> Certs:
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("spillway test CA"))
          .issuer_name(_name("spillway test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(start)
          .not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .sign(ca_key, hashes.SHA256()))

    def leaf(cn: str, usage: x509.ObjectIdentifier, san: bool) -> tuple[x509.Certificate,
                                                                         ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (x509.CertificateBuilder().subject_name(_name(cn)).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.DNSName("localhost")]), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    server, server_key = leaf("127.0.0.1", ExtendedKeyUsageOID.SERVER_AUTH, True)
    client, client_key = leaf("spillway-agent", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    out = Certs(directory / "ca.pem", directory / "server.pem", directory / "server.key",
                directory / "client.pem", directory / "client.key")
    pem = serialization.Encoding.PEM
    out.ca.write_bytes(ca.public_bytes(pem))
    out.server_cert.write_bytes(server.public_bytes(pem))
    out.client_cert.write_bytes(client.public_bytes(pem))
    _write_key(server_key, out.server_key)
    _write_key(client_key, out.client_key)
    return out
