"""GPU models: canonical names, families, memory, and the static-inventory syntax.

Canonical model names are ``FAMILY-<memory>GB`` (``A100-80GB``). A job may ask for a family
(``A100``: any memory size) or an exact model. NVML reports marketing names such as
``NVIDIA A100-SXM4-80GB``; :func:`canonical_model` maps them onto this table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# family -> memory sizes (GB) that exist. Sources: NVIDIA product data sheets.
GPU_FAMILIES: dict[str, tuple[int, ...]] = {
    "K80": (12,),
    "P100": (16,),
    "T4": (16,),
    "V100": (16, 32),
    "A10G": (24,),
    "A10": (24,),
    "L4": (24,),
    "A40": (48,),
    "A6000": (48,),
    "L40S": (48,),
    "A100": (40, 80),
    "H100": (80, 94),
    "H200": (141,),
    "B200": (180,),
    "RTX4090": (24,),
}

KNOWN_MODELS: tuple[str, ...] = tuple(
    f"{family}-{mem}GB" for family, mems in GPU_FAMILIES.items() for mem in mems
)

# MIG profiles by parent family: "<slices>g.<memory>gb". Source: NVIDIA MIG user guide.
MIG_PROFILES: dict[str, tuple[str, ...]] = {
    "A100-40GB": ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-94GB": ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H200-141GB": ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}
ALL_MIG_PROFILES: tuple[str, ...] = tuple(sorted({p for ps in MIG_PROFILES.values() for p in ps}))
_MIG_RE = re.compile(r"^(\d)g\.(\d+)gb$")


def family_of(model: str) -> str:
    return model.split("-", 1)[0].upper()


def memory_of(model: str) -> int:
    m = re.search(r"-(\d+)GB$", model)
    return int(m.group(1)) if m else 0


def normalise_type(name: str) -> str | None:
    """Return the canonical family or model for a user-written GPU type, or None if unknown."""
    up = name.strip().upper().replace("NVIDIA", "").strip(" -_")
    if up in GPU_FAMILIES:
        return up
    m = re.fullmatch(r"([A-Z0-9]+)[-_ ]?(\d+)\s*G(?:B)?", up)
    if m and m.group(1) in GPU_FAMILIES and int(m.group(2)) in GPU_FAMILIES[m.group(1)]:
        return f"{m.group(1)}-{int(m.group(2))}GB"
    return None


def type_matches(model: str, wanted: str) -> bool:
    """True when a node GPU ``model`` satisfies a requested family or exact model."""
    return model == wanted or family_of(model) == wanted


def mig_memory_gb(profile: str) -> int:
    m = _MIG_RE.match(profile)
    return int(m.group(2)) if m else 0


def canonical_model(nvml_name: str, memory_mib: int) -> str:
    """Map an NVML device name and its memory onto a canonical model name.

    Unknown devices keep a cleaned-up version of their NVML name so they still schedule
    for jobs that pin that exact name.
    """
    up = nvml_name.upper()
    mem_gb = memory_mib / 1024
    for family in sorted(GPU_FAMILIES, key=len, reverse=True):
        if re.search(rf"(^|[^A-Z0-9]){re.escape(family)}([^0-9]|$)", up.replace(" ", "-")):
            sizes = GPU_FAMILIES[family]
            best = min(sizes, key=lambda s: abs(s - mem_gb))
            return f"{family}-{best}GB"
    return re.sub(r"[^A-Z0-9]+", "-", up.replace("NVIDIA", "")).strip("-") or "UNKNOWN"


@dataclass(frozen=True)
class InventoryEntry:
    count: int
    model: str


_INV_RE = re.compile(r"^\s*(\d+)\s*[xX*]\s*([A-Za-z0-9_.-]+)\s*$")


def parse_inventory(text: str) -> list[InventoryEntry]:
    """Parse ``4xA100-80GB`` or ``4xA100-80GB,2xT4`` into entries.

    Raises ValueError with a message that names the bad part and the allowed forms.
    """
    entries: list[InventoryEntry] = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _INV_RE.match(part)
        if not m:
            raise ValueError(
                f"GPU inventory {part.strip()!r} is not COUNTxMODEL (for example 4xA100-80GB)"
            )
        count, name = int(m.group(1)), m.group(2)
        model = normalise_type(name)
        if model is None:
            raise ValueError(f"GPU model {name!r} is unknown; use one of: "
                             + ", ".join(KNOWN_MODELS))
        if model in GPU_FAMILIES:
            sizes = GPU_FAMILIES[model]
            if len(sizes) > 1:  # a job may ask for a family; a GPU has one memory size
                gb = " or ".join(", ".join(str(m) for m in sizes).rsplit(", ", 1))
                ways = " or ".join(", ".join(f"{count}x{model}-{m}GB" for m in sizes
                                             ).rsplit(", ", 1))
                raise ValueError(f"GPU model {name!r} is ambiguous: {model}s come with {gb} "
                                 f"GB; write {ways}")
            model = f"{model}-{sizes[0]}GB"
        if count < 1 or count > 64:
            raise ValueError(f"GPU count {count} in {part.strip()!r} must be between 1 and 64")
        entries.append(InventoryEntry(count, model))
    return entries
