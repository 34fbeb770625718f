"""Which hardware a `rediacc.io/dri` name reaches, for exclusive grants.

The unit of a render node is its card, `pci:<bdf>`. When a card is split into partitions that each
have their own render node, the unit is `pci:<bdf>/partition:<k>`. A plugin that knows a card's
partitions records them in the inventory as `attributes.partition` next to `attributes.renderMinor`
and `pciBusId`; that record wins, so every plugin naming the same partition names the same unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rediacc_dri.discovery import KIND, RENDER_ENTRY, SOURCE

PREFIX = f"{KIND}="


def hardware_units(name: str, inventory: Mapping[str, Any]) -> list[str] | None:
    if not name.startswith(PREFIX):
        return None
    match = RENDER_ENTRY.match(name[len(PREFIX) :])
    if not match:
        return [f"cdi:{name}"]  # not a name we publish; still reserved as itself
    return [unit_of_render_minor(int(match.group(1)), inventory.get("gpus") or [])]


def unit_of_render_minor(minor: int, gpus: Sequence[Mapping[str, Any]]) -> str:
    on_node = [g for g in gpus if _attr(g, "renderMinor") == minor]
    for gpu in on_node:
        partition = _attr(gpu, "partition")
        if isinstance(partition, int) and gpu.get("pciBusId"):
            return f"pci:{_bdf(gpu)}/partition:{partition}"
    for gpu in on_node:
        if gpu.get("source") == SOURCE and gpu.get("pciBusId"):
            # Several render nodes on one card with nobody describing them: number them in order.
            siblings = sorted(
                m
                for g in gpus
                if g.get("source") == SOURCE and g.get("pciBusId") == gpu["pciBusId"]
                for m in [_attr(g, "renderMinor")]
                if isinstance(m, int)
            )
            if len(siblings) > 1:
                return f"pci:{_bdf(gpu)}/partition:{siblings.index(minor)}"
            return f"pci:{_bdf(gpu)}"
    for gpu in on_node:
        if gpu.get("pciBusId"):
            return f"pci:{_bdf(gpu)}"
    # No card behind it (a platform device) or not in the inventory: the node is its own unit.
    return f"drm:renderD{minor}"


def _attr(gpu: Mapping[str, Any], key: str) -> Any:
    attributes = gpu.get("attributes")
    return attributes.get(key) if isinstance(attributes, Mapping) else None


def _bdf(gpu: Mapping[str, Any]) -> str:
    return str(gpu["pciBusId"]).lower()
