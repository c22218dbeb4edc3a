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


def render(offer: Offer, kind: str, broker_url: str, request_id: str,
           install_command: str = "", worker_command: str = "spillway") -> str:
    """The boot script for one machine of ``offer`` (provider ``kind``: aws, gcp, libcloud,
    local), joining the broker at ``broker_url``."""
    lookup = INSTANCE_ID_LOOKUP.get(kind, _OTHER)
    args = [shlex.quote(a) for a in ("--redis-url", broker_url, "worker", "--site",
                                     str(offer.site), *worker_args(offer))]
    lines = [
        "#!/bin/sh",
        f"# Spillway cloud worker: request {request_id}, offer {offer.id}",
        "set -eu",
        install_command.strip() or ": no install step",
        lookup,
        'if [ -z "$INSTANCE_ID" ]; then echo "spillway: no instance id" >&2; exit 1; fi',
        'export SPILLWAY_INSTANCE_ID="$INSTANCE_ID"',
        f"exec {worker_command} {' '.join(args)} "
        '--instance-id "$INSTANCE_ID" --node-id "$INSTANCE_ID"',
    ]
    return "\n".join(lines) + "\n"
