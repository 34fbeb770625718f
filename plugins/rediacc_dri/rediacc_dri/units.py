"""Which hardware a `rediacc.io/dri` name reaches, for exclusive grants.

The unit of a render node is its card, `pci:<bdf>`. When a card is split into partitions that each
have their own render node, the unit is `pci:<bdf>/partition:<k>`. A plugin that knows a card's
partitions records them in the inventory as `attributes["partition"]` next to
`attributes["renderMinor"]` and `pci_bus_id`; that record wins, so every plugin naming the same
partition names the same unit.
"""

from __future__ import annotations

from rediacc_core import Gpu, Inventory
from rediacc_dri.discovery import KIND, RENDER_ENTRY, SOURCE

PREFIX = f"{KIND}="


def hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    if not name.startswith(PREFIX):
        return None
    match = RENDER_ENTRY.match(name[len(PREFIX) :])
    if not match:
        return [f"cdi:{name}"]  # not a name we publish; still reserved as itself
    return [unit_of_render_minor(int(match.group(1)), inventory)]


def unit_of_render_minor(minor: int, inventory: Inventory) -> str:
    on_node = inventory.with_attribute("renderMinor", minor)
    for gpu in on_node:
        partition = gpu.int_attribute("partition")
        if partition is not None and gpu.pci_bus_id:
            return f"pci:{_bdf(gpu)}/partition:{partition}"
    for gpu in on_node:
        if gpu.source == SOURCE and gpu.pci_bus_id:
            # Several render nodes on one card with nobody describing them: number them in order.
            siblings = sorted(
                m
                for g in inventory.from_source(SOURCE)
                if g.pci_bus_id == gpu.pci_bus_id
                for m in [g.int_attribute("renderMinor")]
                if m is not None
            )
            if len(siblings) > 1:
                return f"pci:{_bdf(gpu)}/partition:{siblings.index(minor)}"
            return f"pci:{_bdf(gpu)}"
    for gpu in on_node:
        if gpu.pci_bus_id:
            return f"pci:{_bdf(gpu)}"
    # No card behind it (a platform device) or not in the inventory: the node is its own unit.
    return f"drm:renderD{minor}"


def _bdf(gpu: Gpu) -> str:
    return (gpu.pci_bus_id or "").lower()
