"""The last resort: what the kernel module itself says under `/proc/driver/nvidia`.

`version` carries the driver version; `gpus/<bus id>/information` carries each GPU's model, UUID,
bus location and device minor. There is no memory, CUDA version or compute capability here, and no
index: GPUs are numbered in PCI order, which is the order nvidia-smi and CUDA use by default.
"""

from __future__ import annotations

import re

from rediacc_core import Gpu, Machine
from rediacc_nvidia import names
from rediacc_nvidia.values import int_or_none, normalise_bus_id, text_or_none

PROC_DIR = "/proc/driver/nvidia"

# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun ..." or, for the open modules,
# "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.54.03  Release Build ...".
_VERSION = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+(?:\.\d+)+)")


def parse_version(text: str) -> str | None:
    match = _VERSION.search(text)
    return match.group(1) if match else None


def parse_information(text: str) -> dict[str, str | None]:
    """`Key: value` lines (tabs and spaces vary) as a dict."""
    fields: dict[str, str | None] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = text_or_none(value)
    return fields


def discover_proc(machine: Machine, platform: str) -> list[Gpu]:
    base = machine.path(PROC_DIR)
    gpus_dir = base / "gpus"
    if not gpus_dir.is_dir():
        return []
    try:
        driver_version = parse_version((base / "version").read_text(encoding="utf-8", errors="replace"))
    except OSError:
        driver_version = None
    found = []
    for entry in gpus_dir.iterdir():
        info_path = entry / "information"
        try:
            info = parse_information(info_path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        bus_id = normalise_bus_id(info.get("Bus Location")) or normalise_bus_id(entry.name)
        found.append((bus_id or entry.name, info))
    gpus = []
    for index, (bus_id, info) in enumerate(sorted(found, key=lambda item: item[0])):
        uuid = info.get("GPU UUID")
        gpus.append(
            Gpu(
                vendor="nvidia",
                source="nvidia",
                name=info.get("Model") or "NVIDIA GPU",
                index=index,
                pci_bus_id=normalise_bus_id(bus_id),
                driver="nvidia",
                driver_version=driver_version,
                memory_mib=None,
                cdi_names=names.gpu_names(index, uuid),
                attributes={
                    "uuid": uuid,
                    "minor": int_or_none(info.get("Device Minor")),
                    "cudaDriverVersion": None,
                    "computeCapability": None,
                    "brand": None,
                    "architecture": None,
                    "migMode": None,
                    "platform": platform,
                },
            )
        )
    return gpus
