"""The hardware units a CDI name reaches (as the plugins say, from the inventory), and when two
names' units overlap: what an exclusive grant reserves, and what setup's re-check compares. A grant
reserves both what its name reaches now and what it recorded (`bound_to`): after two cards exchange
slots, a suspended exclusive grant still keeps the card it was given on, wherever that card is."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from rediacc_core.bindings import Binding, identify, shared_hardware, units_overlap
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    from rediacc_core.grants.records import Grant
    from rediacc_core.model import Inventory
    from rediacc_core.plugins import Plugins


def overlapping_units(first: Iterable[str], second: Iterable[str]) -> list[tuple[str, str]]:
    others = list(second)
    return [(a, b) for a in first for b in others if units_overlap(a, b)]


class HardwareUnits:
    """Hardware units per name, asking the plugins once per name and loading the inventory only if needed."""

    def __init__(self, machine: Machine, plugins: Plugins, *, inventory: Inventory | None = None) -> None:
        """`inventory`: the facts to place names on (a dry run's, not written); default the machine's."""
        self.machine = machine
        self.plugins = plugins
        self._inventory: Inventory | None = inventory
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

    def in_common(self, name: str, other: Grant) -> str | None:
        """What `name` has in common with another grant, in words for a refusal (` (pci:X)`), or
        None: the units both names reach now overlap, or what `name` reaches now is hardware the
        other grant recorded when it was granted or confirmed."""
        pairs = overlapping_units(self(name), self(other.device))
        if pairs:
            a, b = pairs[0]
            return f" ({a if a == b else f'{a} and {b}'})"
        if other.bound_to:
            found = shared_hardware(self.binding(name), other.bound_to)
            if found is not None:
                return f" ({found[1].text()}, which its grant recorded)"
        return None
