"""GPU discovery: NVML (patched pynvml functions), static inventories and their errors."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pynvml
import pytest

from broker.model import Gpu
from workers.discovery import (
    discover,
    discover_nvml,
    inventory_from_data,
    load_inventory_file,
    static_inventory,
)

GIB = 2**30


def fake_host() -> dict[str, object]:
    """Two A100-80GB: GPU 0 whole, GPU 1 in MIG mode with instances in slots 0, 2 and 5."""
    gpus = {
        "gpu0": {"uuid": "GPU-0000", "name": "NVIDIA A100-SXM4-80GB", "mem": 80 * GIB,
                 "mig": None},
        "gpu1": {"uuid": "GPU-1111", "name": "NVIDIA A100-SXM4-80GB", "mem": 80 * GIB,
                 "mig": {0: ("MIG-aaaa", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9.75 * GIB),
                         2: ("MIG-bbbb", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", 9.75 * GIB),
                         5: ("MIG-cccc", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 39.5 * GIB)}},
    }
    migs = {f"{h}/{slot}": (h, *v) for h, g in gpus.items() for slot, v in (g["mig"] or {}).items()}
    handles = list(gpus)

    def info(h: str) -> dict[str, object]:
        if h in gpus:
            return {"uuid": gpus[h]["uuid"], "name": gpus[h]["name"], "mem": gpus[h]["mem"]}
        _, uuid, name, mem = migs[h]
        return {"uuid": uuid, "name": name, "mem": mem}

    def mig_mode(h: str) -> list[int]:
        if gpus[h]["mig"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return [pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_ENABLE]

    def mig_handle(h: str, slot: int) -> str:
        key = f"{h}/{slot}"
        if key not in migs:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return key

    return {
        "nvmlInit": mock.DEFAULT,
        "nvmlShutdown": mock.DEFAULT,
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
    }


def test_nvml_host_with_one_mig_gpu() -> None:
    with mock.patch.multiple(pynvml, **fake_host()) as fakes:
        gpus = discover_nvml()
    assert gpus == [
        Gpu("GPU-0000", 0, "A100-80GB", 80.0),
        Gpu("GPU-1111", 1, "A100-80GB", 80.0, mig_enabled=True),
        Gpu("MIG-aaaa", 1, "A100-80GB", 10.0, mig_profile="1g.10gb", parent="GPU-1111"),
        Gpu("MIG-bbbb", 1, "A100-80GB", 10.0, mig_profile="1g.10gb", parent="GPU-1111"),
        Gpu("MIG-cccc", 1, "A100-80GB", 40.0, mig_profile="3g.40gb", parent="GPU-1111"),
    ]
    fakes["nvmlInit"].assert_called_once()
    fakes["nvmlShutdown"].assert_called_once()


def test_mig_profile_from_memory_when_the_name_lacks_it() -> None:
    fakes = fake_host()
    real_name = fakes["nvmlDeviceGetName"]
    fakes["nvmlDeviceGetName"] = lambda h: (
        "NVIDIA A100-SXM4-80GB" if "/" in h else real_name(h))  # type: ignore[operator]
    fakes["nvmlDeviceGetAttributes"] = mock.Mock(side_effect=pynvml.NVMLError(
        pynvml.NVML_ERROR_NOT_SUPPORTED))
    with mock.patch.multiple(pynvml, **fakes):
        gpus = discover_nvml()
    assert [g.mig_profile for g in gpus] == [None, None, "1g.10gb", "1g.10gb", "3g.40gb"]


def test_bytes_names_from_older_bindings_are_decoded() -> None:
    fakes = fake_host()
    uuid, name = fakes["nvmlDeviceGetUUID"], fakes["nvmlDeviceGetName"]
    fakes["nvmlDeviceGetUUID"] = lambda h: uuid(h).encode()  # type: ignore[operator]
    fakes["nvmlDeviceGetName"] = lambda h: name(h).encode()  # type: ignore[operator]
    with mock.patch.multiple(pynvml, **fakes):
        gpus = discover_nvml()
    assert gpus[0].id == "GPU-0000" and gpus[-1].mig_profile == "3g.40gb"


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
                                  pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
                                  pynvml.NVML_ERROR_UNKNOWN])
def test_no_nvml_means_no_gpus(code: int) -> None:
    shutdown = mock.Mock()
    with mock.patch.multiple(pynvml, nvmlInit=mock.Mock(side_effect=pynvml.NVMLError(code)),
                             nvmlShutdown=shutdown):
        assert discover_nvml() == []
    shutdown.assert_not_called()


def test_shutdown_runs_when_a_query_fails() -> None:
    fakes = fake_host()
    fakes["nvmlDeviceGetUUID"] = mock.Mock(side_effect=pynvml.NVMLError(
        pynvml.NVML_ERROR_GPU_IS_LOST))
    with mock.patch.multiple(pynvml, **fakes) as patched, pytest.raises(pynvml.NVMLError):
        discover_nvml()
    patched["nvmlShutdown"].assert_called_once()


def test_real_library_is_absent_here_or_answers() -> None:
    # On a machine without the NVIDIA driver this is the LibraryNotFound path, unpatched.
    gpus = discover_nvml()
    assert all(g.id.startswith(("GPU-", "MIG-")) for g in gpus)


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


def test_discover_prefers_text_then_file_then_nvml(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text("gpus: [{model: T4, count: 1}]\n")
    assert [g.model for g in discover("1xL4", str(path), "n1")] == ["L4-24GB"]
    assert [g.model for g in discover(None, str(path), "n1")] == ["T4-16GB"]
    with mock.patch.multiple(pynvml, **fake_host()):
        assert len(discover(None, None, "n1")) == 5
