"""The hardware units a CDI name reaches (as the plugins say, from the inventory), and when two
names' units overlap: what an exclusive grant reserves, and what setup's re-check compares."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rediacc_core.bindings import Binding, identify
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    from rediacc_core.model import Inventory
    from rediacc_core.plugins import Plugins


def units_overlap(a: str, b: str) -> bool:
    """Two hardware units overlap when equal or when one contains the other (`pci:X` holds `pci:X/mig:1`)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def overlapping_units(first: Iterable[str], second: Iterable[str]) -> list[tuple[str, str]]:
    others = list(second)
    return [(a, b) for a in first for b in others if units_overlap(a, b)]


class HardwareUnits:
    """Hardware units per name, asking the plugins once per name and loading the inventory only if needed."""

    def __init__(self, machine: Machine, plugins: Plugins) -> None:
        self.machine = machine
        self.plugins = plugins
        self._inventory: Inventory | None = None
        self._cache: dict[str, tuple[str, ...]] = {}

    def unplaced(self, name: str) -> bool:
        """True when a plugin owns `name` but the inventory places it on no hardware it knows (its
        only unit is the name itself, `cdi:NAME`): an exclusive reservation could not follow it."""
        found = self(name)
        return bool(found) and all(unit.startswith("cdi:") for unit in found)

    def __call__(self, name: str) -> tuple[str, ...]:
        if name not in self._cache:
            self._cache[name] = tuple(self.plugins.hardware_units(name, self.inventory()) or ())
        return self._cache[name]

    def inventory(self) -> Inventory:
        if self._inventory is None:
            # A corrupt inventory raises here: exclusivity that cannot follow hardware must not pass.
            from rediacc_core.inventory import read_inventory
            from rediacc_core.model import Inventory

            self._inventory = read_inventory(self.machine) or Inventory()
        return self._inventory

    def binding(self, name: str) -> Binding:
        """What `name` reaches now, identified (recorded in a grant)."""
        return identify(self(name), self.inventory())
