"""The script a new cloud machine runs at boot (cloud-init user data on AWS and libcloud, the
``startup-script`` on GCP, the boot command of a local machine).

It installs Spillway (a configurable command), learns its own instance id, and execs the
worker agent joined to the broker with the machine's site and instance id::

    spillway --redis-url URL worker --site aws:us-east-1:us-east-1a:spot \\
        --instance-id i-0abc --node-id i-0abc [--gpus 2xA100-80GB --cpus 8 --memory 64]

The instance id comes from the machine's metadata service: IMDSv2 on AWS (a session token,
then ``/latest/meta-data/instance-id``), ``/computeMetadata/v1/instance/name`` on GCP (the GCE
instance name is its provider id). Other kinds read ``$SPILLWAY_INSTANCE_ID`` (the local
provider sets it) or fall back to the host name. ``$SPILLWAY_METADATA_URL`` overrides the
metadata service's base URL (tests point it at a fake).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from urllib.parse import urlsplit

from broker.model.cloud import Offer

METADATA_ENV = "SPILLWAY_METADATA_URL"

_AWS = """META="${SPILLWAY_METADATA_URL:-http://169.254.169.254}"
TOKEN=$(curl -sf --retry 5 -X PUT "$META/latest/api/token" \\
  -H "X-aws-ec2-metadata-token-ttl-seconds: 21600")
INSTANCE_ID=$(curl -sf --retry 5 -H "X-aws-ec2-metadata-token: $TOKEN" \\
  "$META/latest/meta-data/instance-id")"""

_GCP = """META="${SPILLWAY_METADATA_URL:-http://metadata.google.internal}"
INSTANCE_ID=$(curl -sf --retry 5 -H "Metadata-Flavor: Google" \\
  "$META/computeMetadata/v1/instance/name")"""

_OTHER = """INSTANCE_ID="${SPILLWAY_INSTANCE_ID:-$(hostname)}\""""

INSTANCE_ID_LOOKUP: Mapping[str, str] = {"aws": _AWS, "gcp": _GCP}


def worker_args(offer: Offer) -> list[str]:
    """The worker's inventory options an offer carries in its ``extra`` (``gpus``, ``cpus``,
    ``memory_gb``: a machine without NVML, such as a local one); none for a real GPU
    machine, whose agent discovers its GPUs through NVML."""
    args: list[str] = []
    for key, flag in (("gpus", "--gpus"), ("cpus", "--cpus"), ("memory_gb", "--memory")):
        if offer.extra.get(key) not in (None, ""):
            args += [flag, str(offer.extra[key])]
    return args


CA_PATH = "/etc/spillway/redis-ca.pem"  # where a machine keeps the broker's CA certificate


def _secret_lines(broker_url: str, ca_pem: str, ca_path: str) -> tuple[list[str], str]:
    """Lines that put the CA in ``ca_path`` and the URL in ``SPILLWAY_REDIS_URL`` (never on
    a command line, where ``ps`` would show its password), and the URL the agent uses."""
    lines: list[str] = []
    if ca_pem:  # (a certificate is public: no secret in it)
        sep = "&" if "?" in broker_url else "?"
        broker_url = f"{broker_url}{sep}ssl_ca_certs={ca_path}"
        if "ssl_cert_reqs=" not in broker_url:
            broker_url += "&ssl_cert_reqs=required"
        lines += [f"mkdir -p {shlex.quote(ca_path.rsplit('/', 1)[0] or '/')}",
                  f"cat > {shlex.quote(ca_path)} <<'SPILLWAY_CA'",
                  ca_pem.strip(), "SPILLWAY_CA"]
    lines.append(f"export SPILLWAY_REDIS_URL={shlex.quote(broker_url)}")
    return lines, broker_url


def render(offer: Offer, kind: str, broker_url: str, request_id: str,
           install_command: str = "", worker_command: str = "spillway", ca_pem: str = "",
           ca_path: str = CA_PATH) -> str:
    """The boot script for one machine of ``offer`` (provider ``kind``: aws, gcp, libcloud,
    local), joining the broker at ``broker_url``: the agent's own credentials (its ACL user,
    broker/security/acl.py), never the scheduler's. With ``ca_pem`` (the broker's CA
    certificate, PEM) the machine writes it to ``ca_path`` and verifies the broker's TLS
    certificate with it. A URL with a password or a CA is exported in the environment, not
    passed on the agent's command line."""
    lookup = INSTANCE_ID_LOOKUP.get(kind, _OTHER)
    secret = ca_pem or _has_password(broker_url)
    url_args = () if secret else ("--redis-url", broker_url)
    args = [shlex.quote(a) for a in (*url_args, "worker", "--site",
                                     str(offer.site), *worker_args(offer))]
    env_lines = _secret_lines(broker_url, ca_pem, ca_path)[0] if secret else []
    lines = [
        "#!/bin/sh",
        f"# Spillway cloud worker: request {request_id}, offer {offer.id}",
        "set -eu",
        *env_lines,
        install_command.strip() or ": no install step",
        lookup,
        'if [ -z "$INSTANCE_ID" ]; then echo "spillway: no instance id" >&2; exit 1; fi',
        'export SPILLWAY_INSTANCE_ID="$INSTANCE_ID"',
        f"exec {worker_command} {' '.join(args)} "
        '--instance-id "$INSTANCE_ID" --node-id "$INSTANCE_ID"',
    ]
    return "\n".join(lines) + "\n"


def _has_password(url: str) -> bool:
    try:
        return urlsplit(url).password is not None
    except ValueError:
        return True  # (unparsable: keep it off the command line anyway)
