"""Documents and contexts built the way the core builds them, for plugin tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rediacc_core.inventory import SCHEMA_VERSION, check_inventory, gpu_record, inventory_from_document
from rediacc_core.machine import Machine
from rediacc_core.model import GateContext, Gpu, Inventory


def inventory_document(gpus: Iterable[Gpu], platform: str = "native", machine: str = "m1") -> dict[str, Any]:
    """The inventory file's document for `gpus`, every CDI name they claim kept (no specs consulted)."""
    return {
        "schemaVersion": SCHEMA_VERSION,
        "generatedAt": "2026-11-30T06:00:00Z",
        "machine": machine,
        "platform": platform,
        "gpus": [gpu_record(gpu) for gpu in gpus],
        "devices": [],
    }


def inventory_of(gpus: Iterable[Gpu], platform: str = "native", machine: str = "m1") -> Inventory:
    """The typed `Inventory` hooks get for `gpus`: written as a document, validated, read back."""
    document = inventory_document(gpus, platform, machine)
    check_inventory(document, "inventory_of()")
    return inventory_from_document(document)


def gate_context(
    machine: Machine,
    grants: Iterable[str] = (),
    inventory: Inventory | None = None,
    *,
    repo: str = "alpha",
    settings: Mapping[str, Any] | None = None,
    images: Mapping[str, Mapping[str, Any]] | None = None,
    log: list[str] | None = None,
) -> GateContext:
    """A GateContext for `repo` on `machine` as the gate builds one; `images` answers image lookups.

    Lines the rules log are appended to `log` when given.
    """
    lines = log if log is not None else []
    return GateContext(
        repo_name=repo,
        repo_ref=f"{repo}@{machine.name}",
        machine=machine,
        grants=frozenset(grants),
        inventory=inventory,
        settings=dict(settings or {}),
        image_config=lambda image: (images or {}).get(image),
        log=lines.append,
    )
