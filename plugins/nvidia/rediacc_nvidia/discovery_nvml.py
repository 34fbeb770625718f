"""Discovery through NVML (`pynvml` from the nvidia-ml-py package), used on the host itself.

The module is passed in, never imported at the top: the plugin must load on machines without
nvidia-ml-py, and tests hand in a stand-in with the same function names and return shapes.
"""

from __future__ import annotations

import importlib
import math
import re
from typing import Any

from rediacc_core import Gpu, GpuPartition
from rediacc_nvidia import names
from rediacc_nvidia.values import normalise_bus_id

# nvmlBrandType_t, named as nvidia-smi prints `product_brand` (the toolkit lower-cases these and
# drops the spaces when it compares `brand=` terms, which `require.py` does too).
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "GRID",
    5: "GeForce",
    6: "Titan",
    7: "vApps",
    8: "vPC",
    9: "vCS",
    10: "vWS",
    11: "Cloud Gaming",
    12: "Quadro RTX",
    13: "NVIDIA RTX",
    14: "NVIDIA",
    15: "GeForce RTX",
    16: "Titan RTX",
    17: "NVIDIA DLA",
    18: "vGameDev",
    19: "NVIDIA NPU",
}
# nvmlDeviceArchitecture_t, named as nvidia-smi prints `product_architecture`, so both discovery
# paths record the same word (the others, DLA and NPU parts, have no GPU architecture name).
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}
_MIG_ENABLED = 1


def load_nvml() -> Any | None:
    """`pynvml` initialised, or None when the package or the driver's library is missing."""
    try:
        module = importlib.import_module("pynvml")
        module.nvmlInit()
    except Exception:  # ImportError, or NVMLError from a missing/unloadable libnvidia-ml
        return None
    return module


def _text(value: Any) -> str:
    # nvidia-ml-py returns bytes from older releases and str from newer ones.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _optional(call: Any, *args: Any) -> Any | None:
    """NVML answers NOT_SUPPORTED for many queries on some boards; that is "unknown", not an error."""
    try:
        return call(*args)
    except Exception:
        return None


def cuda_version_text(version: int | None) -> str | None:
    """NVML's CUDA driver version integer (12020) as `12.2`."""
    if version is None:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def mig_profile(name: str, attributes: Any | None) -> str | None:
    """`1g.10gb` from a MIG device's name (`NVIDIA H100 ... MIG 1g.10gb`) or else its attributes."""
    match = re.search(r"\bMIG\s+(\S+)\s*$", name)
    if match:
        return match.group(1)
    if attributes is None:
        return None
    gi = int(attributes.gpuInstanceSliceCount)
    ci = int(attributes.computeInstanceSliceCount)
    gb = math.ceil(int(attributes.memorySizeMB) / 1024)
    return f"{gi}g.{gb}gb" if ci == gi else f"{ci}c.{gi}g.{gb}gb"


def _partitions(nvml: Any, handle: Any, gpu_index: int) -> tuple[GpuPartition, ...]:
    count = _optional(nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    partitions = []
    mig_index = 0
    for slot in range(int(count)):
        mig = _optional(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
        if mig is None:  # an empty slot: NVML numbers only the MIG devices that exist
            continue
        uuid = _text(nvml.nvmlDeviceGetUUID(mig))
        memory = _optional(nvml.nvmlDeviceGetMemoryInfo, mig)
        attributes = _optional(nvml.nvmlDeviceGetAttributes, mig)
        partitions.append(
            GpuPartition(
                index=mig_index,
                uuid=uuid,
                profile=mig_profile(_text(_optional(nvml.nvmlDeviceGetName, mig) or ""), attributes),
                memory_mib=int(memory.total) // (1024 * 1024) if memory is not None else None,
                cdi_names=names.mig_names(gpu_index, mig_index, uuid),
                attributes={
                    "gpuInstanceId": _optional(nvml.nvmlDeviceGetGpuInstanceId, mig),
                    "computeInstanceId": _optional(nvml.nvmlDeviceGetComputeInstanceId, mig),
                },
            )
        )
        mig_index += 1
    return tuple(partitions)


def discover_nvml(nvml: Any, platform: str) -> list[Gpu]:
    """Every GPU NVML sees, with MIG devices when MIG mode is on. `nvml` is initialised already."""
    try:
        driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        cuda = cuda_version_text(_optional(nvml.nvmlSystemGetCudaDriverVersion))
        gpus = []
        for index in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            capability = _optional(nvml.nvmlDeviceGetCudaComputeCapability, handle)
            brand = _optional(nvml.nvmlDeviceGetBrand, handle)
            architecture = _optional(nvml.nvmlDeviceGetArchitecture, handle)
            mig_modes = _optional(nvml.nvmlDeviceGetMigMode, handle)
            mig_mode = None
            if mig_modes is not None:
                mig_mode = "Enabled" if int(mig_modes[0]) == _MIG_ENABLED else "Disabled"
            memory = _optional(nvml.nvmlDeviceGetMemoryInfo, handle)
            pci = _optional(nvml.nvmlDeviceGetPciInfo, handle)
            gpus.append(
                Gpu(
                    vendor="nvidia",
                    source="nvidia",
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    index=index,
                    pci_bus_id=normalise_bus_id(_text(pci.busId)) if pci is not None else None,
                    driver="nvidia",
                    driver_version=driver_version,
                    memory_mib=int(memory.total) // (1024 * 1024) if memory is not None else None,
                    cdi_names=names.gpu_names(index, uuid),
                    attributes={
                        "uuid": uuid,
                        "minor": _optional(nvml.nvmlDeviceGetMinorNumber, handle),
                        "cudaDriverVersion": cuda,
                        "computeCapability": f"{capability[0]}.{capability[1]}" if capability else None,
                        "brand": BRANDS.get(int(brand), "Unknown") if brand is not None else None,
                        "architecture": ARCHITECTURES.get(int(architecture))
                        if architecture is not None
                        else None,
                        "migMode": mig_mode,
                        "platform": platform,
                    },
                    partitions=_partitions(nvml, handle, index) if mig_mode == "Enabled" else (),
                )
            )
        return gpus
    finally:
        _optional(nvml.nvmlShutdown)
