"""Shared fixtures: where the real captures live, and inventory documents built from discovery."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from rediacc_core import Gpu

REALDATA = Path(os.environ.get("REDIACC_REALDATA", "../shared/realdata"))


@pytest.fixture
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"real captures not found at {REALDATA} (set REDIACC_REALDATA)")
    return REALDATA


@pytest.fixture
def capture(realdata: Path) -> Callable[[str], str]:
    """A real capture's text by its path under the realdata directory."""

    def read(relative: str) -> str:
        return (realdata / relative).read_text(encoding="utf-8")

    return read


def _inventory_of(gpus: Iterable[Gpu], platform: str = "native") -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "generatedAt": "2026-11-30T06:00:00Z",
        "machine": "m1",
        "platform": platform,
        "gpus": [
            {
                "vendor": gpu.vendor,
                "source": gpu.source,
                "name": gpu.name,
                "index": gpu.index,
                "pciBusId": gpu.pci_bus_id,
                "driver": gpu.driver,
                "driverVersion": gpu.driver_version,
                "memoryMiB": gpu.memory_mib,
                "cdiNames": list(gpu.cdi_names),
                "attributes": dict(gpu.attributes),
                "partitions": [
                    {
                        "index": part.index,
                        "uuid": part.uuid,
                        "profile": part.profile,
                        "memoryMiB": part.memory_mib,
                        "cdiNames": list(part.cdi_names),
                        "attributes": dict(part.attributes),
                    }
                    for part in gpu.partitions
                ],
            }
            for gpu in gpus
        ],
        "devices": [],
    }


@pytest.fixture
def inventory_of() -> Callable[..., dict[str, Any]]:
    """An inventory document as the core writes it (CONTRACTS.md), from discovered GPUs."""
    return _inventory_of
