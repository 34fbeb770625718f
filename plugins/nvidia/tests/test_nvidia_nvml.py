"""The NVML path against a stand-in `pynvml` module shaped like nvidia-ml-py's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rediacc_nvidia import testing
from rediacc_nvidia.discovery import discover
from rediacc_nvidia.discovery_nvml import ARCHITECTURES, cuda_version_text, discover_nvml, mig_profile

from rediacc_core import GpuPartition
from rediacc_core.machine import Machine
from rediacc_core.testing import FakeMachine


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


def fake_nvml(*, mig: bool = True, name_as_bytes: bool = True) -> Any:
    """Two GPUs: an H100 with two MIG devices (slots 0 and 2 used) and an L40S without MIG support."""
    calls: list[str] = []

    def text(value: str) -> str | bytes:
        return value.encode() if name_as_bytes else value

    gpus = {
        0: {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
            "bus": b"00000000:09:00.0",
            "mem": 81559 * 2**20,
            "cc": (9, 0),
            "brand": 14,
            "arch": 9,
            "minor": 0,
        },
        1: {
            "name": "NVIDIA L40S",
            "uuid": "GPU-bbbbbbbb-0000-0000-0000-000000000000",
            "bus": b"00000000:8A:00.0",
            "mem": 46068 * 2**20,
            "cc": (8, 9),
            "brand": 13,
            "arch": 8,
            "minor": 1,
        },
    }
    migs = {
        (0, 0): {
            "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
            "uuid": "MIG-11111111-0000-0000-0000-000000000000",
            "mem": 40192 * 2**20,
            "gi": 2,
            "ci": 0,
        },
        (0, 2): {
            "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
            "uuid": "MIG-22222222-0000-0000-0000-000000000000",
            "mem": 9856 * 2**20,
            "gi": 9,
            "ci": 0,
        },
    }

    def info(handle: Any) -> dict[str, Any]:
        return migs[handle] if isinstance(handle, tuple) else gpus[handle]

    def mig_mode(handle: int) -> list[int]:
        if handle == 1 or not mig:
            raise NVMLError_NotSupported()
        return [1, 1]

    def mig_handle(handle: int, slot: int) -> tuple[int, int]:
        if (handle, slot) not in migs:
            raise NVMLError_NotFound()
        return (handle, slot)

    def attributes(handle: tuple[int, int]) -> Any:
        raise NVMLError_NotSupported()

    return SimpleNamespace(
        calls=calls,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlSystemGetDriverVersion=lambda: text("590.48.01"),
        nvmlSystemGetCudaDriverVersion=lambda: 13010,
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda index: index,
        nvmlDeviceGetName=lambda handle: text(info(handle)["name"]),
        nvmlDeviceGetUUID=lambda handle: text(info(handle)["uuid"]),
        nvmlDeviceGetPciInfo=lambda handle: SimpleNamespace(busId=info(handle)["bus"], busIdLegacy=b""),
        nvmlDeviceGetMemoryInfo=lambda handle: SimpleNamespace(total=info(handle)["mem"], free=0, used=0),
        nvmlDeviceGetCudaComputeCapability=lambda handle: info(handle)["cc"],
        nvmlDeviceGetBrand=lambda handle: info(handle)["brand"],
        nvmlDeviceGetArchitecture=lambda handle: info(handle)["arch"],
        nvmlDeviceGetMinorNumber=lambda handle: info(handle)["minor"],
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=lambda handle: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetGpuInstanceId=lambda handle: info(handle)["gi"],
        nvmlDeviceGetComputeInstanceId=lambda handle: info(handle)["ci"],
        nvmlDeviceGetAttributes=attributes,
    )


def test_nvml_reports_every_gpu_with_its_facts() -> None:
    nvml = fake_nvml()
    h100, l40s = discover_nvml(nvml, "native")
    assert (h100.index, h100.name, h100.pci_bus_id, h100.memory_mib) == (
        0,
        "NVIDIA H100 80GB HBM3",
        "0000:09:00.0",
        81559,
    )
    assert h100.driver_version == "590.48.01"
    assert h100.cdi_names == ("nvidia.com/gpu=0", "nvidia.com/gpu=GPU-aaaaaaaa-0000-0000-0000-000000000000")
    assert dict(h100.attributes) == {
        "uuid": "GPU-aaaaaaaa-0000-0000-0000-000000000000",
        "minor": 0,
        "cudaDriverVersion": "13.1",
        "computeCapability": "9.0",
        "brand": "NVIDIA",
        "architecture": "Hopper",
        "migMode": "Enabled",
        "platform": "native",
    }
    assert (l40s.pci_bus_id, l40s.attributes["brand"], l40s.attributes["migMode"]) == (
        "0000:8a:00.0",
        "NVIDIA RTX",
        None,
    )
    assert l40s.partitions == ()
    assert nvml.calls[-1] == "shutdown", "NVML is shut down after discovery"


def test_nvml_numbers_only_existing_mig_devices() -> None:
    h100 = discover_nvml(fake_nvml(), "native")[0]
    assert h100.partitions == (
        GpuPartition(
            index=0,
            uuid="MIG-11111111-0000-0000-0000-000000000000",
            profile="3g.40gb",
            memory_mib=40192,
            cdi_names=("nvidia.com/gpu=0:0", "nvidia.com/gpu=MIG-11111111-0000-0000-0000-000000000000"),
            attributes={"gpuInstanceId": 2, "computeInstanceId": 0},
        ),
        GpuPartition(
            index=1,
            uuid="MIG-22222222-0000-0000-0000-000000000000",
            profile="1g.10gb",
            memory_mib=9856,
            cdi_names=("nvidia.com/gpu=0:1", "nvidia.com/gpu=MIG-22222222-0000-0000-0000-000000000000"),
            attributes={"gpuInstanceId": 9, "computeInstanceId": 0},
        ),
    )


def test_nvml_accepts_str_returns_of_newer_nvidia_ml_py() -> None:
    gpus = discover_nvml(fake_nvml(name_as_bytes=False), "native")
    assert gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_cuda_driver_version_integer_is_major_dot_minor() -> None:
    assert cuda_version_text(12020) == "12.2"
    assert cuda_version_text(11060) == "11.6"
    assert cuda_version_text(13010) == "13.1"
    assert cuda_version_text(None) is None


def test_mig_profile_from_attributes_when_the_name_lacks_it() -> None:
    attrs = SimpleNamespace(gpuInstanceSliceCount=3, computeInstanceSliceCount=1, memorySizeMB=72448)
    assert mig_profile("NVIDIA H200", attrs) == "1c.3g.71gb"
    attrs = SimpleNamespace(gpuInstanceSliceCount=1, computeInstanceSliceCount=1, memorySizeMB=9856)
    assert mig_profile("NVIDIA H100", attrs) == "1g.10gb"
    assert mig_profile("NVIDIA H100", None) is None


def test_host_machine_prefers_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = fake_nvml()
    monkeypatch.setattr(Machine, "is_host", property(lambda self: True))
    gpus = discover(Machine("host", Path("/nonexistent-root")), nvml_loader=lambda: nvml)
    assert [g.name for g in gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA L40S"]


def test_the_real_nvidia_ml_py_has_every_function_used() -> None:
    pynvml = pytest.importorskip("pynvml")
    used = [name for name in vars(fake_nvml()) if name.startswith("nvml")]
    assert [name for name in used if not hasattr(pynvml, name)] == []


H200 = "nvidia-h200-vm_580.159.04"


def test_nvml_and_nvidia_smi_report_the_same_facts_of_a_real_h200(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    xml, csv = capture(f"{H200}/nvidia-smi-q-x.xml"), capture(f"{H200}/nvidia-smi-query_idle.csv")
    fm = make_fake_machine("h200")
    testing.nvidia_machine(fm, xml, list_output=capture(f"{H200}/nvidia-smi-L.txt"), query_output=csv)
    (by_smi,) = discover(fm.machine)  # a rooted machine: its nvidia-smi
    (by_nvml,) = discover_nvml(testing.nvml_from_captures(xml, csv), "native")
    assert by_smi.attributes["architecture"] == "Hopper"
    assert by_nvml == by_smi


def test_every_nvml_architecture_is_named_as_nvidia_smi_names_it(capture: Callable[[str], str]) -> None:
    printed = {
        line.split(">", 1)[1]
        for name in (
            "a100-sxm4-40gb-mig_510.47.03",
            "rtx-4090_535.86.05",
            "rtx-pro-6000-blackwell-maxq_590.44.01",
        )
        for line in capture(f"nvidia-smi-q-x/{name}.xml").splitlines()
        if "<product_architecture>" in line
        for line in [line.strip().removesuffix("</product_architecture>")]
    }
    assert printed == {"Ampere", "Ada Lovelace", "Blackwell"}
    assert printed <= set(ARCHITECTURES.values())
