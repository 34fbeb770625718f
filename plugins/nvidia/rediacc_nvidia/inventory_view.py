"""The NVIDIA part of a machine's inventory document, and finding the GPU a CDI name reaches.

The inventory is plain JSON written by the core (see CONTRACTS.md); this module reads the fields this
plugin put there (`attributes.uuid`, partitions' `gpuInstanceId`...) and never trusts their types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rediacc_nvidia import names

_MIG_INDEX = re.compile(r"^(\d+):(\d+)$")


@dataclass(frozen=True)
class Partition:
    index: int
    uuid: str | None
    cdi_names: tuple[str, ...]
    attributes: Mapping[str, Any]


@dataclass(frozen=True)
class InventoryGpu:
    index: int | None
    name: str
    pci_bus_id: str | None
    driver_version: str | None
    cdi_names: tuple[str, ...]
    attributes: Mapping[str, Any]
    partitions: tuple[Partition, ...] = field(default=())

    @property
    def uuid(self) -> str | None:
        value = self.attributes.get("uuid")
        return value if isinstance(value, str) else None

    @property
    def label(self) -> str:
        return f"GPU {self.index} ({self.name})" if self.index is not None else self.name


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def nvidia_gpus(inventory: Mapping[str, Any] | None) -> list[InventoryGpu]:
    """The GPUs this plugin recorded (source `nvidia`), in the inventory's order."""
    if not inventory:
        return []
    gpus = []
    for entry in inventory.get("gpus") or []:
        if not isinstance(entry, Mapping) or entry.get("source") != "nvidia":
            continue
        partitions = tuple(
            Partition(
                index=_int(part.get("index")) or 0,
                uuid=part.get("uuid") if isinstance(part.get("uuid"), str) else None,
                cdi_names=_strings(part.get("cdiNames")),
                attributes=_mapping(part.get("attributes")),
            )
            for part in entry.get("partitions") or []
            if isinstance(part, Mapping)
        )
        gpus.append(
            InventoryGpu(
                index=_int(entry.get("index")),
                name=str(entry.get("name") or "NVIDIA GPU"),
                pci_bus_id=entry.get("pciBusId") if isinstance(entry.get("pciBusId"), str) else None,
                driver_version=entry.get("driverVersion")
                if isinstance(entry.get("driverVersion"), str)
                else None,
                cdi_names=_strings(entry.get("cdiNames")),
                attributes=_mapping(entry.get("attributes")),
                partitions=partitions,
            )
        )
    return gpus


def resolve(name: str, gpus: list[InventoryGpu]) -> tuple[InventoryGpu, Partition | None] | None:
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
        if device.lower().startswith("gpu-") and (gpu.uuid or "").lower() == device.lower():
            return gpu, None
        if mig and gpu.index == int(mig.group(1)):
            by_index = next((p for p in gpu.partitions if p.index == int(mig.group(2))), None)
            return (gpu, by_index) if by_index is not None else None
        if device.lower().startswith("mig-"):
            by_uuid = next((p for p in gpu.partitions if (p.uuid or "").lower() == device.lower()), None)
            if by_uuid is not None:
                return gpu, by_uuid
    return None
