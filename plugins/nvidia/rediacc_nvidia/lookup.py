"""Finding, in the machine's typed inventory, the NVIDIA GPU (and MIG device) a CDI name reaches.

The core hands hooks an `Inventory` of `Gpu`s; this module reads the fields this plugin put in their
`attributes` (`uuid`; a partition's `gpuInstanceId`...) through the typed accessors.
"""

from __future__ import annotations

import re

from rediacc_core import Gpu, GpuPartition, Inventory
from rediacc_nvidia import names

SOURCE = "nvidia"
_MIG_INDEX = re.compile(r"^(\d+):(\d+)$")


def nvidia_gpus(inventory: Inventory | None) -> list[Gpu]:
    """The GPUs this plugin recorded (source `nvidia`), in the inventory's order."""
    return [] if inventory is None else list(inventory.from_source(SOURCE))


def gpu_uuid(gpu: Gpu) -> str | None:
    return gpu.str_attribute("uuid")


def label(gpu: Gpu) -> str:
    name = gpu.name or "NVIDIA GPU"
    return f"GPU {gpu.index} ({name})" if gpu.index is not None else name


def resolve(name: str, gpus: list[Gpu]) -> tuple[Gpu, GpuPartition | None] | None:
    """The GPU (and MIG device) a qualified `nvidia.com/gpu=` name other than `all` reaches."""
    for gpu in gpus:
        if name in gpu.cdi_names:
            return gpu, None
        for part in gpu.partitions:
            if name in part.cdi_names:
                return gpu, part
    device = names.device_part(name)
    if device is None:
        return None
    # Names the inventory does not list (a spec newer than the inventory): read the name's own form.
    mig = _MIG_INDEX.match(device)
    for gpu in gpus:
        if device.isdigit() and gpu.index == int(device):
            return gpu, None
        if device.lower().startswith("gpu-") and (gpu_uuid(gpu) or "").lower() == device.lower():
            return gpu, None
        if mig and gpu.index == int(mig.group(1)):
            by_index = gpu.partition(int(mig.group(2)))
            return (gpu, by_index) if by_index is not None else None
        if device.lower().startswith("mig-"):
            by_uuid = next((p for p in gpu.partitions if (p.uuid or "").lower() == device.lower()), None)
            if by_uuid is not None:
                return gpu, by_uuid
    return None
