"""A real `spillway api` process over TLS for tests and the API bench: a CA and a server
certificate made on the spot (the ``cryptography`` package), uvicorn as a subprocess."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import signal
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from broker.control.embedded import free_port
from broker.waiting import poll_until


def make_certs(where: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate, server key) for localhost and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("spillway test CA"))
          .issuer_name(name("spillway test CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now)
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(name("localhost")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = where / "ca.pem", where / "server.pem", where / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


class ApiServer:
    """`spillway api` on a free port over TLS; ``restart()`` stops it and starts it again."""

    def __init__(self, redis_url: str, workdir: Path, *args: str) -> None:
        self.redis_url, self.workdir, self.args = redis_url, workdir, args
        self.ca, self.cert, self.key = make_certs(workdir)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {**os.environ, "HOME": str(workdir), "SPILLWAY_HOLD_IF_INFEASIBLE": "true",
                    "PYTHONUNBUFFERED": "1"}

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.workdir / "api.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker.cli", "--redis-url", self.redis_url, "api",
             "--port", str(self.port), "--cert", str(self.cert), "--key", str(self.key),
             *self.args], env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir,
            start_new_session=True)
        log.close()
        ctx = ssl.create_default_context(cafile=str(self.ca))

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"spillway api exited {self.proc.returncode}: "
                                     f"{(self.workdir / 'api.log').read_text()[-2000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(
                    self.url + "/healthz", context=ctx, timeout=2) as r:
                return r.status == 200
            return False

        poll_until(ready, timeout, "spillway api to answer /healthz", every=0.1,
                   error=AssertionError)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def api_server(redis_url: str, workdir: Path, *args: str) -> Iterator[ApiServer]:
    server = ApiServer(redis_url, workdir, *args)
    server.start()
    try:
        yield server
    finally:
        server.stop()

