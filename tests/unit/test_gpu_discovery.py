"""GPU discovery: NVML (a fake ``pynvml`` module), static inventories and their errors.

The NVML tests inject a fake ``pynvml`` module into ``sys.modules`` (discovery imports it
lazily), so they run the discovery code the same way on every machine, with or without the
``nvidia-ml-py`` package or a GPU. One test reads the real device, and runs only where NVML
answers (a GPU host).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest

from broker.model import Gpu
from broker.model.gpus import KNOWN_MODELS
from workers import discovery
from workers.discovery import (
    discover,
    discover_nvml,
    inventory_from_data,
    load_inventory_file,
    static_inventory,
)

GIB = 2**30

# the return codes and constants of nvidia-ml-py that discovery uses (same values)
NOT_SUPPORTED, NOT_FOUND, LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED = 3, 6, 12, 9
GPU_IS_LOST, UNKNOWN, MIG_ENABLE = 15, 999, 1


class NVMLError(Exception):
    """As in pynvml: ``NVMLError(code)`` is an instance of the code's own subclass."""

    by_code: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int) -> NVMLError:
        sub = NVMLError.by_code.get(value, cls) if cls is NVMLError else cls
        return Exception.__new__(sub)

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_NotFound(NVMLError):  # (pynvml's name)
    pass


NVMLError.by_code[NOT_FOUND] = NVMLError_NotFound


# /proc/driver/nvidia-caps/mig-minors of the fake host: GPU minor 0's GPU instances 1, 3 and 6
MIG_MINORS = """config 1
monitor 2
gpu0/gi1/access 21
gpu0/gi1/ci0/access 22
gpu0/gi3/access 30
gpu0/gi3/ci0/access 31
gpu0/gi6/access 60
gpu0/gi6/ci0/access 61
"""


def fake_host() -> dict[str, Any]:
    """Two A100-80GB: GPU 0 whole (/dev/nvidia2), GPU 1 (/dev/nvidia0) in MIG mode with
    instances in slots 0, 2 and 5 (GPU instances 1, 3 and 6, compute instance 0 each)."""
    gpus: dict[str, dict[str, Any]] = {
        "gpu0": {"uuid": "GPU-0000", "name": "NVIDIA A100-SXM4-80GB", "mem": 80 * GIB,
                 "mig": None, "minor": 2},
        "gpu1": {"uuid": "GPU-1111", "name": "NVIDIA A100-SXM4-80GB", "mem": 80 * GIB,
                 "minor": 0,
                 "mig": {0: ("MIG-aaaa", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9.75 * GIB),
                         2: ("MIG-bbbb", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9.75 * GIB),
                         5: ("MIG-cccc", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 39.5 * GIB)}},
    }
    migs = {f"{h}/{slot}": (h, *v) for h, g in gpus.items() for slot, v in (g["mig"] or {}).items()}
    handles = list(gpus)

    def info(h: str) -> dict[str, Any]:
        if h in gpus:
            return {"uuid": gpus[h]["uuid"], "name": gpus[h]["name"], "mem": gpus[h]["mem"]}
        _, uuid, name, mem = migs[h]
        return {"uuid": uuid, "name": name, "mem": mem}

    def mig_mode(h: str) -> list[int]:
        if gpus[h]["mig"] is None:
            raise NVMLError(NOT_SUPPORTED)
        return [MIG_ENABLE, MIG_ENABLE]

    def mig_handle(h: str, slot: int) -> str:
        key = f"{h}/{slot}"
        if key not in migs:
            raise NVMLError(NOT_FOUND)
        return key

    return {
        "nvmlInit": mock.Mock(),
        "nvmlShutdown": mock.Mock(),
        "nvmlDeviceGetCount": lambda: len(handles),
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetIndex": lambda h: handles.index(h),
        "nvmlDeviceGetUUID": lambda h: info(h)["uuid"],
        "nvmlDeviceGetName": lambda h: info(h)["name"],
        "nvmlDeviceGetMemoryInfo": lambda h: SimpleNamespace(total=info(h)["mem"], used=0,
                                                             free=info(h)["mem"]),
        "nvmlDeviceGetMigMode": mig_mode,
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
        "nvmlDeviceGetAttributes": mock.Mock(side_effect=NVMLError(NOT_SUPPORTED)),
        "nvmlDeviceGetMinorNumber": lambda h: gpus[h]["minor"],
        "nvmlDeviceGetGpuInstanceId": lambda h: int(h.split("/")[1]) + 1,
        "nvmlDeviceGetComputeInstanceId": lambda h: 0,
    }


Install = Callable[..., ModuleType]


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Install:
    """``install(**functions)``: put a fake ``pynvml`` module with these functions (default:
    :func:`fake_host`) in ``sys.modules`` for the test, and its caps' ``mig-minors``; returns
    it."""
    (tmp_path / "mig-minors").write_text(MIG_MINORS)
    monkeypatch.setattr(discovery, "MIG_MINORS", str(tmp_path / "mig-minors"))

    def install(**functions: Any) -> ModuleType:
        mod = ModuleType("pynvml")
        mod.NVMLError = NVMLError  # type: ignore[attr-defined]
        mod.NVMLError_NotFound = NVMLError_NotFound  # type: ignore[attr-defined]
        mod.NVML_DEVICE_MIG_ENABLE = MIG_ENABLE  # type: ignore[attr-defined]
        for name, fn in {**fake_host(), **functions}.items():
            setattr(mod, name, fn)
        monkeypatch.setitem(sys.modules, "pynvml", mod)
        return mod

    return install


def test_nvml_host_with_one_mig_gpu(fake_nvml: Install) -> None:
    nv = fake_nvml()
    gpus = discover_nvml()
    assert gpus == [
        Gpu("GPU-0000", 0, "A100-80GB", 80.0, minor=2),
        Gpu("GPU-1111", 1, "A100-80GB", 80.0, mig_enabled=True, minor=0),
        Gpu("MIG-aaaa", 1, "A100-80GB", 10.0, mig_profile="1g.10gb", parent="GPU-1111",
            minor=0, caps=(21, 22)),
        Gpu("MIG-bbbb", 1, "A100-80GB", 10.0, mig_profile="1g.10gb", parent="GPU-1111",
            minor=0, caps=(30, 31)),
        Gpu("MIG-cccc", 1, "A100-80GB", 40.0, mig_profile="3g.40gb", parent="GPU-1111",
            minor=0, caps=(60, 61)),
    ]
    nv.nvmlInit.assert_called_once()
    nv.nvmlShutdown.assert_called_once()


def test_the_fake_module_is_the_one_discovery_reads(fake_nvml: Install) -> None:
    """Another fake host: one H100 with no MIG support at all, at NVML index 3."""
    fake_nvml(nvmlDeviceGetCount=lambda: 1, nvmlDeviceGetHandleByIndex=lambda i: "h",
              nvmlDeviceGetIndex=lambda h: 3, nvmlDeviceGetUUID=lambda h: "GPU-h100",
              nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3",
              nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=80 * GIB),
              nvmlDeviceGetMigMode=mock.Mock(side_effect=NVMLError(NOT_SUPPORTED)),
              nvmlDeviceGetMinorNumber=lambda h: 7)
    assert discover_nvml() == [Gpu("GPU-h100", 3, "H100-80GB", 80.0, minor=7)]


def test_the_index_falls_back_to_the_enumeration_order(fake_nvml: Install) -> None:
    fake_nvml(nvmlDeviceGetIndex=mock.Mock(side_effect=NVMLError(NOT_SUPPORTED)))
    assert [g.index for g in discover_nvml()] == [0, 1, 1, 1, 1]


def test_a_gpu_with_mig_mode_off_is_whole(fake_nvml: Install) -> None:
    fake_nvml(nvmlDeviceGetMigMode=lambda h: [0, 0])
    assert [(g.id, g.mig_enabled, g.mig_profile) for g in discover_nvml()] == [
        ("GPU-0000", False, None), ("GPU-1111", False, None)]


def test_mig_profile_from_memory_when_the_name_lacks_it(fake_nvml: Install) -> None:
    real_name = fake_host()["nvmlDeviceGetName"]
    fake_nvml(nvmlDeviceGetName=lambda h: "NVIDIA A100-SXM4-80GB" if "/" in h else real_name(h))
    gpus = discover_nvml()
    assert [g.mig_profile for g in gpus] == [None, None, "1g.10gb", "1g.10gb", "3g.40gb"]
    assert [g.memory_gb for g in gpus] == [80.0, 80.0, 10.0, 10.0, 40.0]


def test_mig_profile_from_slices_when_the_name_lacks_it(fake_nvml: Install) -> None:
    """Slices and memory from nvmlDeviceGetAttributes: 4 slices of 40 GB is 4g.40gb."""
    real_name = fake_host()["nvmlDeviceGetName"]
    fake_nvml(nvmlDeviceGetName=lambda h: "NVIDIA A100-SXM4-80GB" if "/" in h else real_name(h),
              nvmlDeviceGetAttributes=lambda h: SimpleNamespace(
                  gpuInstanceSliceCount=4 if h.endswith("/5") else 1, memorySizeMB=9984
                  if not h.endswith("/5") else 40448))
    assert [g.mig_profile for g in discover_nvml()] == [None, None, "1g.10gb", "1g.10gb",
                                                         "4g.40gb"]


def test_bytes_names_from_older_bindings_are_decoded(fake_nvml: Install) -> None:
    host = fake_host()
    uuid, name = host["nvmlDeviceGetUUID"], host["nvmlDeviceGetName"]
    fake_nvml(nvmlDeviceGetUUID=lambda h: uuid(h).encode(),
              nvmlDeviceGetName=lambda h: name(h).encode())
    gpus = discover_nvml()
    assert [g.id for g in gpus] == ["GPU-0000", "GPU-1111", "MIG-aaaa", "MIG-bbbb", "MIG-cccc"]
    assert gpus[0].model == "A100-80GB" and gpus[-1].mig_profile == "3g.40gb"


@pytest.mark.parametrize("code", [LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED, UNKNOWN])
def test_no_nvml_means_no_gpus(fake_nvml: Install, code: int) -> None:
    nv = fake_nvml(nvmlInit=mock.Mock(side_effect=NVMLError(code)))
    assert discover_nvml() == []
    nv.nvmlInit.assert_called_once()
    nv.nvmlShutdown.assert_not_called()


def test_no_nvidia_ml_py_package_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert discover_nvml() == []


def test_shutdown_runs_when_a_query_fails(fake_nvml: Install) -> None:
    nv = fake_nvml(nvmlDeviceGetUUID=mock.Mock(side_effect=NVMLError(GPU_IS_LOST)))
    with pytest.raises(NVMLError):
        discover_nvml()
    nv.nvmlShutdown.assert_called_once()


def _real_nvml_gpus() -> int:
    """How many GPUs the real NVML reports (0: no package, no driver or no GPU)."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.skipif(_real_nvml_gpus() == 0, reason="needs an NVIDIA GPU, its driver and "
                                                    "nvidia-ml-py")
def test_the_real_devices() -> None:
    import pynvml

    gpus = discover_nvml()
    whole = [g for g in gpus if g.mig_profile is None]
    assert len(whole) == _real_nvml_gpus() > 0
    assert sorted(g.index for g in whole) == list(range(len(whole)))
    assert all(g.id.startswith("GPU-") for g in whole)
    assert all(g.id.startswith("MIG-") and g.parent for g in gpus if g.mig_profile)
    assert all(g.model in KNOWN_MODELS and g.memory_gb > 0 for g in gpus), gpus
    pynvml.nvmlInit()
    try:
        uuids = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                 for i in range(len(whole))}
    finally:
        pynvml.nvmlShutdown()
    assert {g.id for g in whole} == {u.decode() if isinstance(u, bytes) else u for u in uuids}
    assert all(g.minor is not None and os.path.exists(f"/dev/nvidia{g.minor}") for g in whole)


# -- static inventories -----------------------------------------------------------------------


def test_static_inventory_text() -> None:
    gpus = static_inventory("2xA100-80GB, 1xT4", "n1")
    assert gpus == [
        Gpu("GPU-n1-0", 0, "A100-80GB", 80.0),
        Gpu("GPU-n1-1", 1, "A100-80GB", 80.0),
        Gpu("GPU-n1-2", 2, "T4-16GB", 16.0),
    ]


@pytest.mark.parametrize(("text", "needle"), [
    ("4xA100", "ambiguous"),
    ("4xZ9000", "unknown"),
    ("A100-80GB", "COUNTxMODEL"),
    ("0xT4", "between 1 and 64"),
    ("", "empty"),
])
def test_static_inventory_errors(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        static_inventory(text, "n1")


def test_inventory_file_with_mig(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("gpus:\n"
                    "  - {model: A100-80GB, count: 2}\n"
                    "  - {model: A100-80GB, mig: [1g.10gb, 1g.10gb, 3g.40gb]}\n"
                    "  - {model: t4}\n")
    gpus = load_inventory_file(path, "n1")
    assert gpus == [
        Gpu("GPU-n1-0", 0, "A100-80GB", 80.0),
        Gpu("GPU-n1-1", 1, "A100-80GB", 80.0),
        Gpu("GPU-n1-2", 2, "A100-80GB", 80.0, mig_enabled=True),
        Gpu("MIG-n1-2-0", 2, "A100-80GB", 10.0, mig_profile="1g.10gb", parent="GPU-n1-2"),
        Gpu("MIG-n1-2-1", 2, "A100-80GB", 10.0, mig_profile="1g.10gb", parent="GPU-n1-2"),
        Gpu("MIG-n1-2-2", 2, "A100-80GB", 40.0, mig_profile="3g.40gb", parent="GPU-n1-2"),
        Gpu("GPU-n1-3", 3, "T4-16GB", 16.0),
    ]


def test_inventory_minors_name_each_gpus_device_node() -> None:
    """``minors``: /dev/nvidiaN of each GPU of an entry (a MIG instance: its parent's); a GPU
    without one is its index's (so a minor given to another GPU is refused)."""
    gpus = inventory_from_data({"gpus": [
        {"model": "A100-80GB", "count": 2, "minors": [4, 1]},
        {"model": "A100-80GB", "mig": ["3g.40gb"], "minors": [0]},
        {"model": "T4"},
    ]}, "n1")
    assert [(g.id, g.minor, g.device_minor) for g in gpus] == [
        ("GPU-n1-0", 4, 4), ("GPU-n1-1", 1, 1), ("GPU-n1-2", 0, 0), ("MIG-n1-2-0", 0, 0),
        ("GPU-n1-3", None, 3)]


def test_an_nvml_gpu_without_a_minor_falls_back_to_its_index(
        fake_nvml: Install, caplog: pytest.LogCaptureFixture) -> None:
    fake_nvml(nvmlDeviceGetMinorNumber=mock.Mock(side_effect=NVMLError(NOT_SUPPORTED)))
    gpus = discover_nvml()
    assert [(g.minor, g.device_minor, g.caps) for g in gpus] == [
        (None, 0, ()), (None, 1, ()), (None, 1, ()), (None, 1, ()), (None, 1, ())]
    assert "GPU GPU-0000: NVML gives no device minor" in caplog.text


def test_mig_caps_not_found_are_left_out_with_a_warning(
        fake_nvml: Install, caplog: pytest.LogCaptureFixture, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml()
    monkeypatch.setattr(discovery, "MIG_MINORS", str(tmp_path / "none"))
    gpus = discover_nvml()
    assert [g.caps for g in gpus if g.mig_profile] == [(), (), ()]
    assert "MIG device MIG-aaaa: gpu0/gi1/access and gpu0/gi1/ci0/access not in" in caplog.text


@pytest.mark.parametrize(("data", "needles"), [
    ([], ["top level", "gpus"]),
    ({"gpus": [], "extra": 1}, ["unknown keys", "allowed: gpus"]),
    ({"gpus": ["A100"]}, ["gpus[0]", "mapping"]),
    ({"gpus": [{"count": 2}]}, ["gpus[0].model", "required"]),
    ({"gpus": [{"model": "A100"}]}, ["gpus[0].model", "A100-80GB"]),
    ({"gpus": [{"model": "T4", "count": 0}]}, ["gpus[0].count", "1..64"]),
    ({"gpus": [{"model": "T4", "count": "two"}]}, ["gpus[0].count"]),
    ({"gpus": [{"model": "T4", "size": 1}]}, ["gpus[0]", "size", "model, count, mig"]),
    ({"gpus": [{"model": "T4", "mig": ["1g.5gb"]}]}, ["gpus[0].mig", "does not support MIG",
                                                       "A100-80GB"]),
    ({"gpus": [{"model": "A100-80GB"}, {"model": "A100-80GB", "mig": ["1g.5gb"]}]},
     ["gpus[1].mig[0]", "'1g.5gb'", "allowed: 1g.10gb, 1g.20gb"]),
    ({"gpus": [{"model": "A100-80GB", "mig": []}]}, ["gpus[0].mig", "non-empty"]),
    ({"gpus": [{"model": "A100-80GB", "mig": ["4g.40gb", "4g.40gb"]}]},
     ["gpus[0].mig", "8 compute slices"]),
    ({"gpus": [{"model": "T4", "count": 2, "minors": [1]}]}, ["gpus[0].minors", "list of 2"]),
    ({"gpus": [{"model": "T4", "minors": [255]}]}, ["gpus[0].minors", "0..253"]),
    ({"gpus": [{"model": "T4", "minors": [True]}]}, ["gpus[0].minors"]),
    ({"gpus": [{"model": "T4", "minors": 1}]}, ["gpus[0].minors"]),
    ({"gpus": [{"model": "T4", "count": 2}, {"model": "T4", "minors": [1]}]},
     ["minor(s) [1] given to more than one GPU"]),
])
def test_inventory_file_errors_name_the_field(data: object, needles: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        inventory_from_data(data, "n1", source="inv.yaml")
    for needle in needles:
        assert needle in str(info.value)


def test_inventory_file_unreadable_or_not_yaml(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        load_inventory_file(tmp_path / "nope.yaml", "n1")
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpus: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_inventory_file(bad, "n1")


def test_discover_prefers_text_then_file_then_nvml(tmp_path: Path, fake_nvml: Install) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("gpus: [{model: T4, count: 1}]\n")
    assert [g.model for g in discover("1xL4", str(path), "n1")] == ["L4-24GB"]
    assert [g.model for g in discover(None, str(path), "n1")] == ["T4-16GB"]
    fake_nvml()
    assert [g.id for g in discover(None, None, "n1")] == [
        "GPU-0000", "GPU-1111", "MIG-aaaa", "MIG-bbbb", "MIG-cccc"]
