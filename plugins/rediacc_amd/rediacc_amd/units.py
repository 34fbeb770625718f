"""Which hardware a `rediacc.io/amd` name reaches, for exclusive grants.

`gpu<N>` reaches its card, `pci:<bdf>`, or one partition of it, `pci:<bdf>/partition:<k>`; `all`
reaches every card. The inventory records each GPU's `pciBusId`, `attributes.partition` and
`attributes.renderMinor`, which is how the render-node plugin finds the same unit for the same
partition's `rediacc.io/dri` name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rediacc_amd.discovery import KIND, SOURCE

PREFIX = f"{KIND}="


def unit_of(gpu: Mapping[str, Any]) -> str:
    attributes = gpu.get("attributes") or {}
    partition = attributes.get("partition") if isinstance(attributes, Mapping) else None
    card = f"pci:{str(gpu['pciBusId']).lower()}"
    return f"{card}/partition:{partition}" if isinstance(partition, int) else card


def hardware_units(name: str, inventory: Mapping[str, Any]) -> list[str] | None:
    if not name.startswith(PREFIX):
        return None
    mine = [g for g in inventory.get("gpus") or [] if g.get("source") == SOURCE and g.get("pciBusId")]
    device = name[len(PREFIX) :]
    if device == "all":
        cards = sorted({f"pci:{str(g['pciBusId']).lower()}" for g in mine})
        return cards or [f"cdi:{name}"]
    named = [
        unit_of(g) for g in mine if name in (g.get("cdiNames") or []) or f"gpu{g.get('index')}" == device
    ]
    # A name the inventory does not know (setup not rerun since the hardware changed): itself.
    return named[:1] or [f"cdi:{name}"]
