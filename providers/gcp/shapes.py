"""What a GCE instance looks like to Spillway: names from request ids, GPUs, states, times.

Pure functions, no SDK: the provider (providers/gcp/provider.py) builds its requests from these.

Facts used (Google Cloud documentation, "GPU machine types" and "Instance life cycle"):
A2, A3, A4 and G2 machine types come with their GPUs attached (``a2-highgpu-8g`` has 8 A100
40GB; a request must not add ``guestAccelerators``); N1 machine types take GPUs as
``guestAccelerators`` of an accelerator type such as ``nvidia-tesla-t4``. Instance names are
``[a-z]([-a-z0-9]{0,61}[a-z0-9])?``; a zone is ``<region>-<letter>`` (``us-central1-a``).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import datetime

from broker.model.cloud import InstanceState, Market

# Machine-type families whose GPUs are part of the type (no guestAccelerators).
IMPLICIT_GPU_FAMILIES = frozenset({"a2", "a3", "a4", "a4x", "g2"})

# Canonical GPU model (broker.model.gpus) -> GCE accelerator type, for N1 machine types.
ACCELERATOR_TYPES: dict[str, str] = {
    "K80-12GB": "nvidia-tesla-k80",
    "P100-16GB": "nvidia-tesla-p100",
    "T4-16GB": "nvidia-tesla-t4",
    "V100-16GB": "nvidia-tesla-v100",
    "L4-24GB": "nvidia-l4",
    "A100-40GB": "nvidia-tesla-a100",
    "A100-80GB": "nvidia-a100-80gb",
    "H100-80GB": "nvidia-h100-80gb",
    "H200-141GB": "nvidia-h200-141gb",
    "B200-180GB": "nvidia-b200",
}

# GCE instance status -> InstanceState, as providers/aws/provider.py maps EC2's: a machine that is
# coming up or running is BOOTING (the reconciler, not the provider, knows when its agent
# registered); one being deleted is TERMINATED; one that exists but does not run (stopped,
# suspended: its disk is still billed) or is being repaired is FAILED, for the reconciler to
# reap.
NATIVE_STATES: dict[str, InstanceState] = {
    "PENDING": InstanceState.BOOTING,
    "PROVISIONING": InstanceState.BOOTING,  # resources being allocated
    "STAGING": InstanceState.BOOTING,  # resources acquired, booting
    "RUNNING": InstanceState.BOOTING,  # the machine runs; its agent may not have joined yet
    "STOPPING": InstanceState.TERMINATED,  # going away: a delete, or a preempted spot machine
    "PENDING_STOP": InstanceState.TERMINATED,
    "DEPROVISIONING": InstanceState.TERMINATED,
    "SUSPENDING": InstanceState.FAILED,
    "SUSPENDED": InstanceState.FAILED,  # not running; memory and disk still billed
    "STOPPED": InstanceState.FAILED,
    "TERMINATED": InstanceState.FAILED,  # GCE's word for stopped: the boot disk stays
    "REPAIRING": InstanceState.FAILED,  # broke (a host error); replace it, do not wait
}

_ZONE = re.compile(r"([a-z]+-[a-z]+[0-9]+)-[a-z]")
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def region_of(zone: str) -> str:
    """``us-central1`` for ``us-central1-a``; ValueError for anything that is not a zone."""
    m = _ZONE.fullmatch(zone)
    if not m:
        raise ValueError(f"zone {zone!r} is not a GCE zone name (such as us-central1-a)")
    return m.group(1)


def machine_family(machine_type: str) -> str:
    return machine_type.split("-", 1)[0].lower()


_WITH_GPUS = re.compile(r"([a-z0-9-]+)\+([a-z0-9-]+)x([0-9]+)")


def split_type(instance_type: str) -> tuple[str, str, int]:
    """(machine type, accelerator type, count) of a catalog instance type: the catalog
    names an N1 offer with its attached GPUs, ``n1-standard-8+nvidia-tesla-v100x1``
    (providers/catalog/gcp_hosts.py); other names have no accelerator part ("", 0)."""
    m = _WITH_GPUS.fullmatch(instance_type)
    return (m.group(1), m.group(2), int(m.group(3))) if m else (instance_type, "", 0)


def accelerator_for(machine_type: str, gpu_model: str, override: str = "") -> str | None:
    """The accelerator type to attach, or None when the machine type carries its GPUs."""
    if machine_family(machine_type) in IMPLICIT_GPU_FAMILIES:
        return None
    if override:
        return override
    if gpu_model not in ACCELERATOR_TYPES:
        raise ValueError(f"GPU model {gpu_model!r} has no GCE accelerator type for machine "
                         f"type {machine_type!r}; known: {', '.join(sorted(ACCELERATOR_TYPES))}"
                         " (or set accelerator_type in the offer's extra)")
    return ACCELERATOR_TYPES[gpu_model]


def instance_name(cluster: str, request_id: str, zone: str, index: int) -> str:
    """The name of machine ``index`` of a launch: the same request, zone and index give the
    same name, so a repeated launch finds its machines instead of starting more. A digest of
    the cluster, request and zone keeps names apart across clusters and zones."""
    digest = hashlib.sha256(f"{cluster}/{request_id}/{zone}".encode()).hexdigest()[:8]
    readable = _NOT_NAME.sub("-", request_id.lower()).strip("-")[:40].rstrip("-") or "req"
    if not readable[0].isalpha():
        readable = "r" + readable[:39]
    return f"{readable}-{digest}-{index}"


def insert_request_id(name: str, project: str) -> str:
    """The ``requestId`` of an insert (a UUID, as Compute asks): the same machine name in the
    same project always sends the same one, so Compute ignores a repeated insert."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"spillway://gce/{project}/{name}"))


def market_of(provisioning_model: str, preemptible: bool = False) -> Market:
    return Market.SPOT if provisioning_model == "SPOT" or preemptible else Market.ONDEMAND


def parse_time(text: str) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp (``2026-12-05T03:18:03.123-08:00``)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def last_part(url: str) -> str:
    """``a2-highgpu-1g`` for ``.../zones/us-central1-a/machineTypes/a2-highgpu-1g``."""
    return url.rstrip("/").rsplit("/", 1)[-1]
