"""GPU discovery: NVML on a GPU host, or a static inventory (text or YAML) anywhere else.

Every function returns ``list[Gpu]``: whole GPUs, and for a MIG-enabled GPU the GPU itself
(``mig_enabled=True``, not allocatable) followed by one entry per MIG instance whose ``id`` is the
instance's UUID, the value a job gets in ``CUDA_VISIBLE_DEVICES``.

Each device carries the minor of its ``/dev/nvidiaN`` (``Gpu.minor``; a MIG instance: its
parent's) and, for a MIG instance, the minors of its ``/dev/nvidia-caps`` devices (``Gpu.caps``),
so the job's device fence (:mod:`workers.devices`) allows exactly those. NVML reports the minor
(``nvmlDeviceGetMinorNumber``); a MIG instance's GPU and compute instance ids lead to its caps
in ``/proc/driver/nvidia-caps/mig-minors`` (lines ``gpu<minor>/gi<g>/access <cap minor>`` and
``gpu<minor>/gi<g>/ci<c>/access <cap minor>``), as NVIDIA's container toolkit reads them. A
static inventory's GPU gets its index as minor unless the YAML names ``minors``.

``pynvml`` is the module of the ``nvidia-ml-py`` distribution; it is imported lazily so a host
without the NVIDIA driver never loads it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from broker.model import Gpu
from broker.model.gpus import (
    MIG_PROFILES,
    canonical_model,
    memory_of,
    mig_memory_gb,
    parse_inventory,
)

log = logging.getLogger(__name__)

_MIG_NAME_RE = re.compile(r"(\d+)g\.(\d+)gb", re.IGNORECASE)
_MAX_SLICES = 7  # compute slices of one MIG-capable GPU
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"


# ---------------------------------------------------------------------------------------------
# NVML


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_nvml() -> list[Gpu]:
    """Every GPU and MIG instance NVML reports; ``[]`` when there is no driver or library."""
    try:
        import pynvml
    except ImportError:
        log.info("nvidia-ml-py is not installed: no NVML GPUs")
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.info("NVML unavailable (%s): no NVML GPUs", e)
        return []
    try:
        out: list[Gpu] = []
        caps = mig_cap_minors()
        for i in range(pynvml.nvmlDeviceGetCount()):
            out += _nvml_device(pynvml, pynvml.nvmlDeviceGetHandleByIndex(i), i, caps)
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as e:  # pragma: no cover - driver went away meanwhile
            log.info("nvmlShutdown failed: %s", e)


def _nvml_device(nv: Any, handle: Any, fallback_index: int,
                 caps: Mapping[str, int] | None = None) -> list[Gpu]:
    uuid = _text(nv.nvmlDeviceGetUUID(handle))
    try:
        index = int(nv.nvmlDeviceGetIndex(handle))
    except nv.NVMLError:
        index = fallback_index
    minor = _minor(nv, handle, uuid, index)
    mem_bytes = int(nv.nvmlDeviceGetMemoryInfo(handle).total)
    model = canonical_model(_text(nv.nvmlDeviceGetName(handle)), mem_bytes // 2**20)
    memory_gb = round(mem_bytes / 2**30, 1)
    if not _mig_enabled(nv, handle):
        return [Gpu(uuid, index, model, memory_gb, minor=minor)]
    out = [Gpu(uuid, index, model, memory_gb, mig_enabled=True, minor=minor)]
    for slot in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nv.NVMLError_NotFound:
            continue  # an empty slot: no instance there
        profile = _mig_profile(nv, mig, model)
        mig_mem: float = mig_memory_gb(profile) if profile else 0
        if not mig_mem:
            mig_mem = round(int(nv.nvmlDeviceGetMemoryInfo(mig).total) / 2**30, 1)
        mig_uuid = _text(nv.nvmlDeviceGetUUID(mig))
        out.append(Gpu(mig_uuid, index, model, float(mig_mem), mig_profile=profile,
                       parent=uuid, minor=minor,
                       caps=_mig_caps(nv, mig, mig_uuid, minor, caps or {})))
    return out


def _minor(nv: Any, handle: Any, uuid: str, index: int) -> int | None:
    """The minor of the GPU's ``/dev/nvidiaN`` (often not its NVML index); None if unknown."""
    try:
        return int(nv.nvmlDeviceGetMinorNumber(handle))
    except (nv.NVMLError, AttributeError) as e:
        log.warning("GPU %s: NVML gives no device minor (%s); its jobs are allowed "
                    "/dev/nvidia%d (its index), which may be another GPU's", uuid, e, index)
        return None


def mig_cap_minors(path: str | None = None) -> dict[str, int]:
    """``/proc/driver/nvidia-caps/mig-minors`` (:data:`MIG_MINORS`): cap name
    (``gpu0/gi1/access``) -> its minor in ``/dev/nvidia-caps``; empty where the driver has no
    MIG caps."""
    path = path or MIG_MINORS
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        name, _, minor = line.strip().rpartition(" ")
        if name and minor.isdigit():
            out[name] = int(minor)
    return out


def _mig_caps(nv: Any, mig: Any, uuid: str, gpu_minor: int | None, caps: Mapping[str, int]
              ) -> tuple[int, ...]:
    """The minors of a MIG instance's GPU instance and compute instance caps; () with a
    warning when they cannot be found (its jobs then cannot open them)."""
    if gpu_minor is None:
        return ()  # (its GPU's warning said so)
    try:
        gi = int(nv.nvmlDeviceGetGpuInstanceId(mig))
        ci = int(nv.nvmlDeviceGetComputeInstanceId(mig))
    except (nv.NVMLError, AttributeError) as e:
        log.warning("MIG device %s: no GPU/compute instance id from NVML (%s); its "
                    "/dev/nvidia-caps devices are not allowed to its jobs", uuid, e)
        return ()
    names = (f"gpu{gpu_minor}/gi{gi}/access", f"gpu{gpu_minor}/gi{gi}/ci{ci}/access")
    if not all(n in caps for n in names):
        log.warning("MIG device %s: %s not in %s; its /dev/nvidia-caps devices are not allowed "
                    "to its jobs", uuid, " and ".join(names), MIG_MINORS)
        return ()
    return tuple(caps[n] for n in names)


def _mig_enabled(nv: Any, handle: Any) -> bool:
    try:
        current, _pending = nv.nvmlDeviceGetMigMode(handle)
    except nv.NVMLError:  # NotSupported on GPUs without MIG
        return False
    return int(current) == int(nv.NVML_DEVICE_MIG_ENABLE)


def _mig_profile(nv: Any, mig: Any, model: str) -> str | None:
    """``1g.10gb``-style profile from the MIG device name, else from its slices and memory."""
    try:
        m = _MIG_NAME_RE.search(_text(nv.nvmlDeviceGetName(mig)))
    except nv.NVMLError:
        m = None
    if m:
        return f"{int(m.group(1))}g.{int(m.group(2))}gb"
    slices: int | None = None
    try:
        attrs = nv.nvmlDeviceGetAttributes(mig)
        slices, mem_gb = int(attrs.gpuInstanceSliceCount), int(attrs.memorySizeMB) / 1024
    except (nv.NVMLError, AttributeError):
        mem_gb = int(nv.nvmlDeviceGetMemoryInfo(mig).total) / 2**30
    known = [p for p in MIG_PROFILES.get(model, ())
             if slices is None or p.startswith(f"{slices}g.")]
    if not known:
        return None
    # reported memory is a little under the profile's nominal size; prefer fewer slices on ties
    return min(known, key=lambda p: (abs(mig_memory_gb(p) - mem_gb), p))


# ---------------------------------------------------------------------------------------------
# Static inventories


def static_inventory(text: str, node_id: str) -> list[Gpu]:
    """GPUs from ``4xA100-80GB`` or ``4xA100-80GB,2xT4``, with ids ``GPU-<node>-<index>``."""
    entries = parse_inventory(text)
    if not entries:
        raise ValueError("GPU inventory is empty; write COUNTxMODEL, e.g. 4xA100-80GB,2xT4")
    out: list[Gpu] = []
    for entry in entries:
        for _ in range(entry.count):
            i = len(out)
            out.append(Gpu(f"GPU-{node_id}-{i}", i, entry.model, float(memory_of(entry.model))))
    return out


def load_inventory_file(path: str | Path, node_id: str) -> list[Gpu]:
    """GPUs from a YAML file::

        gpus:
          - {model: A100-80GB, count: 2}
          - {model: A100-80GB, mig: [1g.10gb, 1g.10gb, 3g.40gb]}

    A ``mig`` list makes each GPU of that entry MIG-enabled with those instances, with ids
    ``MIG-<node>-<gpu index>-<n>``. ``minors: [N, ...]`` (one per GPU of the entry) names the
    ``/dev/nvidiaN`` of each; without it a GPU's minor is its index. Raises ValueError naming
    the field and the allowed values.
    """
    p = Path(path).expanduser()
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ValueError(f"cannot read GPU inventory file {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"GPU inventory file {p} is not valid YAML: {e}") from None
    return inventory_from_data(data, node_id, source=str(p))


def inventory_from_data(data: Any, node_id: str, source: str = "inventory") -> list[Gpu]:
    if not isinstance(data, Mapping) or not isinstance(data.get("gpus"), list):
        raise ValueError(f"{source}: top level must be a mapping with a 'gpus' list, e.g. "
                         "gpus: [{model: A100-80GB, count: 2}]")
    unknown = set(data) - {"gpus"}
    if unknown:
        raise ValueError(f"{source}: unknown keys {sorted(unknown)}; allowed: gpus")
    out: list[Gpu] = []
    for i, item in enumerate(data["gpus"]):
        physical = sum(1 for g in out if g.mig_profile is None)
        out += _inventory_entry(item, f"{source}: gpus[{i}]", node_id, physical)
    minors = [g.device_minor for g in out if g.mig_profile is None]
    twice = sorted({m for m in minors if minors.count(m) > 1})
    if twice:
        raise ValueError(f"{source}: gpus: minor(s) {twice} given to more than one GPU; each "
                         "GPU has its own /dev/nvidiaN")
    return out


def _inventory_entry(item: Any, where: str, node_id: str, first_index: int) -> list[Gpu]:
    if not isinstance(item, Mapping):
        raise ValueError(f"{where}: must be a mapping with model, and count or mig")
    unknown = set(item) - {"model", "count", "mig", "minors"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: model, count, mig, "
                         "minors")
    if "model" not in item:
        raise ValueError(f"{where}.model: is required (a GPU model such as A100-80GB)")
    try:
        model = parse_inventory(f"1x{item['model']}")[0].model
    except ValueError as e:
        raise ValueError(f"{where}.model: {e}") from None
    count = item.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
        raise ValueError(f"{where}.count: {count!r} is not allowed; use a whole number 1..64")
    profiles = _mig_list(item.get("mig"), model, f"{where}.mig")
    minors = _minor_list(item.get("minors"), count, f"{where}.minors")
    out: list[Gpu] = []
    for k in range(count):
        index = first_index + k
        uuid = f"GPU-{node_id}-{index}"
        mem = float(memory_of(model))
        minor = minors[k] if minors else None
        out.append(Gpu(uuid, index, model, mem, mig_enabled=bool(profiles), minor=minor))
        out += [Gpu(f"MIG-{node_id}-{index}-{n}", index, model, float(mig_memory_gb(p)),
                    mig_profile=p, parent=uuid, minor=minor) for n, p in enumerate(profiles)]
    return out


def _minor_list(raw: Any, count: int, where: str) -> list[int]:
    """``minors``: one /dev/nvidiaN minor per GPU of the entry (0..253; 254 and 255 are
    nvidia-modeset and nvidiactl)."""
    if raw is None:
        return []
    if (not isinstance(raw, list) or len(raw) != count
            or not all(isinstance(m, int) and not isinstance(m, bool) and 0 <= m <= 253
                       for m in raw)):
        raise ValueError(f"{where}: {raw!r} is not allowed; use a list of {count} whole "
                         "number(s) 0..253, one /dev/nvidiaN minor per GPU of the entry")
    return list(raw)


def _mig_list(raw: Any, model: str, where: str) -> list[str]:
    if raw is None:
        return []
    allowed = MIG_PROFILES.get(model)
    if not allowed:
        raise ValueError(f"{where}: {model} does not support MIG; MIG models: "
                         + ", ".join(MIG_PROFILES))
    if not isinstance(raw, list) or not raw:
        raise ValueError(f"{where}: must be a non-empty list of profiles ({', '.join(allowed)})")
    out = []
    for n, p in enumerate(raw):
        name = str(p).strip().lower()
        if name not in allowed:
            raise ValueError(f"{where}[{n}]: {p!r} is not a MIG profile of {model}; allowed: "
                             + ", ".join(allowed))
        out.append(name)
    slices = sum(int(p.split("g.", 1)[0]) for p in out)
    if slices > _MAX_SLICES:
        raise ValueError(f"{where}: {out} use {slices} compute slices; one GPU has "
                         f"{_MAX_SLICES}")
    return out


# ---------------------------------------------------------------------------------------------


def discover(gpus: str | None, inventory: str | None, node_id: str) -> list[Gpu]:
    """Static text wins, then an inventory file, then NVML."""
    if gpus:
        return static_inventory(gpus, node_id)
    if inventory:
        return load_inventory_file(inventory, node_id)
    return discover_nvml()
