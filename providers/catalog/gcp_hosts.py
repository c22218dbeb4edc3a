"""GCP GPU machines: which host VM carries N accelerators, and what that host costs.

GCP prices an N1 or A2 VM and its attached GPUs separately (the SkyPilot GCP catalog of
2022-06 holds the GPU part only), so an offer's price is the host's plus the GPUs'. The host
is priced per vCPU-hour and per GB-hour of memory.

Sources
-------
[P] Google Cloud, "VM instance pricing" (cloud.google.com/compute/vm-instance-pricing),
    N1 and A2 predefined vCPU and memory list prices, Iowa (us-central1), 2022; South Carolina
    (us-east1) and Oregon (us-west1) list the same. Checks: n1-standard-8 = $0.379998/h on
    demand and $0.08/h preemptible; a2-highgpu-1g = $3.673385/h with its A100 at $2.933908/h,
    and about $1.10/h preemptible with the A100 at $0.88/h.
[G] Google Cloud, "GPU platforms" (cloud.google.com/compute/docs/gpus): the most vCPUs an N1
    VM may have per GPU count (K80 8 per GPU, P100 16, V100 12, T4 48 for one GPU) and the A2
    shapes (a2-highgpu-Ng: 12 vCPUs and 85 GB per A100; a2-megagpu-16g: 96 vCPUs, 1360 GB).
"""

from __future__ import annotations

from dataclasses import dataclass

# region -> (vCPU $/h, GB $/h) on demand and preemptible, for N1 and for A2 hosts [P]
_N1 = ((0.031611, 0.004237), (0.006655, 0.000892))
_A2 = ((0.031611, 0.004237), (0.009483, 0.001271))
HOST_RATES: dict[str, dict[str, tuple[tuple[float, float], tuple[float, float]]]] = {
    region: {"n1": _N1, "a2": _A2} for region in ("us-central1", "us-east1", "us-west1")
}

# GCP accelerator type -> (canonical model, the catalog's accelerator name)
ACCELERATORS: dict[str, tuple[str, str]] = {
    "nvidia-tesla-k80": ("K80-12GB", "K80"),
    "nvidia-tesla-p100": ("P100-16GB", "P100"),
    "nvidia-tesla-v100": ("V100-16GB", "V100"),
    "nvidia-tesla-t4": ("T4-16GB", "T4"),
    "nvidia-tesla-a100": ("A100-40GB", "A100"),
    "nvidia-a100-80gb": ("A100-80GB", "A100-80GB"),
    "nvidia-l4": ("L4-24GB", "L4"),
    "nvidia-h100-80gb": ("H100-80GB", "H100"),
}
BY_NAME = {name: acc for acc, (_, name) in ACCELERATORS.items()}

_A2_SHAPES = {1: "a2-highgpu-1g", 2: "a2-highgpu-2g", 4: "a2-highgpu-4g", 8: "a2-highgpu-8g",
              16: "a2-megagpu-16g"}


@dataclass(frozen=True)
class Host:
    machine_type: str
    family: str  # "n1" or "a2": which rates price it
    vcpus: int
    memory_gb: float


def host_for(accelerator: str, count: int) -> Host | None:
    """The VM that carries ``count`` GPUs: an A2 shape for A100s, else n1-standard with 8
    vCPUs per GPU (within the per-GPU limit of [G]); None for a count GCP does not offer."""
    if accelerator == "nvidia-tesla-a100":
        name = _A2_SHAPES.get(count)
        if name is None:
            return None
        return Host(name, "a2", 96 if count == 16 else 12 * count,
                    1360.0 if count == 16 else 85.0 * count)
    if count not in (1, 2, 4, 8):
        return None
    vcpus = 8 * count  # n1-standard-{8,16,32,64}: 3.75 GB per vCPU
    return Host(f"n1-standard-{vcpus}", "n1", vcpus, 3.75 * vcpus)


def host_price(host: Host, region: str, spot: bool) -> float | None:
    """The host's list price per hour in ``region``; None where [P] gives none here."""
    rates = HOST_RATES.get(region, {}).get(host.family)
    if rates is None:
        return None
    cpu, mem = rates[1 if spot else 0]
    return host.vcpus * cpu + host.memory_gb * mem


def instance_type(host: Host, accelerator: str, count: int) -> str:
    """The catalog's name for a GCP offer: the machine type, and its GPUs when attached
    (A2 shapes include theirs): ``n1-standard-8+nvidia-tesla-v100x1``, ``a2-highgpu-1g``."""
    return host.machine_type if host.family == "a2" else \
        f"{host.machine_type}+{accelerator}x{count}"
