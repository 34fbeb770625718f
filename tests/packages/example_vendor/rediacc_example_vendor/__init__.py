"""A third-party plugin, shaped as an outside vendor would ship one."""

from __future__ import annotations

from rediacc_core import Gpu, hookimpl
from rediacc_core.machine import Machine


@hookimpl
def rdc_discover(machine: Machine) -> list[Gpu]:
    return []


@hookimpl
def rdc_hardware_units(name: str, inventory: object) -> list[str] | None:
    return ["pci:0000:99:00.0"] if name.startswith("example.com/") else None
