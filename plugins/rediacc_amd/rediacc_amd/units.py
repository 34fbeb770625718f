"""Which hardware a `rediacc.io/amd` name reaches, for exclusive grants.

`gpu<N>` reaches its card, `pci:<bdf>`, or one partition of it, `pci:<bdf>/partition:<k>`; `all`
reaches every card. Each GPU this plugin recorded in the inventory carries its `pci_bus_id`,
`attributes["partition"]` and `attributes["renderMinor"]`, which is how the render-node plugin finds
the same unit for the same partition's `rediacc.io/dri` name.
"""

from __future__ import annotations

from rediacc_amd.discovery import KIND, SOURCE
from rediacc_core import Gpu, Inventory

PREFIX = f"{KIND}="


def card_unit(gpu: Gpu) -> str:
    return f"pci:{(gpu.pci_bus_id or '').lower()}"


def unit_of(gpu: Gpu) -> str:
    partition = gpu.int_attribute("partition")
    return f"{card_unit(gpu)}/partition:{partition}" if partition is not None else card_unit(gpu)


def hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    if not name.startswith(PREFIX):
        return None
    mine = [gpu for gpu in inventory.from_source(SOURCE) if gpu.pci_bus_id]
    device = name[len(PREFIX) :]
    if device == "all":
        return sorted({card_unit(gpu) for gpu in mine}) or [f"cdi:{name}"]
    named = [unit_of(gpu) for gpu in mine if name in gpu.cdi_names or f"gpu{gpu.index}" == device]
    # A name the inventory does not know (setup not rerun since the hardware changed): itself.
    return named[:1] or [f"cdi:{name}"]
