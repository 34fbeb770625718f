"""Shared pieces of the render-node plugin's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pytest

from rediacc_core import GateContext, Gpu
from rediacc_core.machine import Machine


def inventory_entry(gpu: Gpu) -> dict[str, Any]:
    """A GPU as the inventory records it (the documented camelCase shape)."""
    return {
        "vendor": gpu.vendor,
        "source": gpu.source,
        "name": gpu.name,
        "index": gpu.index,
        "pciBusId": gpu.pci_bus_id,
        "driver": gpu.driver,
        "cdiNames": list(gpu.cdi_names),
        "attributes": dict(gpu.attributes),
        "partitions": [],
    }


@pytest.fixture
def inventory_of() -> Callable[[Iterable[Gpu]], dict[str, Any]]:
    def build(gpus: Iterable[Gpu]) -> dict[str, Any]:
        return {"schemaVersion": 1, "gpus": [inventory_entry(g) for g in gpus], "devices": []}

    return build


@pytest.fixture
def gate_context() -> Callable[..., GateContext]:
    """A GateContext for repo `alpha` on `machine`, built directly as the gate would."""

    def build(
        machine: Machine, grants: Iterable[str] = (), inventory: Mapping[str, Any] | None = None
    ) -> GateContext:
        return GateContext(
            repo_name="alpha",
            repo_ref=f"alpha@{machine.name}",
            machine=machine,
            grants=frozenset(grants),
            inventory=inventory,
            settings={},
            image_config=lambda image: None,
            log=lambda line: None,
        )

    return build
