"""Hardware units of NVIDIA CDI names, so exclusive grants follow the hardware.

A GPU is `pci:<bus id>`; a MIG device is a child of its GPU, `pci:<bus id>/mig:<mig index>`. Two MIG
slices of one GPU therefore do not overlap, while a slice and its whole GPU (or `all`) do.
"""

from __future__ import annotations

from rediacc_core import Gpu, GpuPartition, Inventory
from rediacc_nvidia import names
from rediacc_nvidia.lookup import gpu_uuid, nvidia_gpus, resolve


def gpu_unit(gpu: Gpu) -> str:
    if gpu.pci_bus_id:
        return f"pci:{gpu.pci_bus_id.lower()}"
    # No bus id recorded (should not happen): fall back to a name that is still the same card's.
    return f"cdi:{names.qualified(str(gpu.index) if gpu.index is not None else gpu_uuid(gpu) or gpu.name)}"


def partition_unit(gpu: Gpu, part: GpuPartition) -> str:
    return f"{gpu_unit(gpu)}/mig:{part.index}"


def hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    """Units of a `nvidia.com/gpu=` name; None for every other kind (other plugins answer those)."""
    device = names.device_part(name)
    if device is None:
        return None
    gpus = nvidia_gpus(inventory)
    if device == "all":
        units = sorted({gpu_unit(gpu) for gpu in gpus})
        # No GPU recorded (WSL before its first setup): `all` still overlaps itself.
        return units or [f"cdi:{name}"]
    found = resolve(name, gpus)
    if found is None:
        return [f"cdi:{name}"]
    gpu, part = found
    return [partition_unit(gpu, part)] if part is not None else [gpu_unit(gpu)]
