"""GPU health at the command line: what `rdc machine gpu list` shows of it, and `rdc machine gpu clear`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rediacc_core.cli.output import table
from rediacc_core.errors import ValidationError
from rediacc_core.health import Recorded, cards_of_name, clear, read_health, record_events, refuses
from rediacc_core.health import unhealthy_cards as held_back
from rediacc_core.inventory import read_inventory
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    from rediacc_core.model import Inventory


def unhealthy(target: Machine, *, scan: bool = False) -> dict[str, list[Recorded]]:
    """The cards held back, as recorded; with `scan`, after asking the plugins for their events."""
    if not scan:
        return held_back(read_health(target))
    from rediacc_core.plugins import get_plugins  # the plugins only for a command that asks them

    inventory = read_inventory(target)
    if inventory is None:
        return held_back(read_health(target))
    return held_back(record_events(target, get_plugins().health(target, inventory)))


def held_back_note(target: Machine, cards: Mapping[str, Sequence[Recorded]]) -> list[str]:
    """One line per card held back, for the data forms (`-o json`), which print the inventory only."""
    return [
        f"Note: the GPU at {card} is held back for its health ({events[-1].event.reason}, seen "
        f"{events[-1].seen_at}); once it is sound: `rdc machine gpu clear {target.name} --device {card}`"
        for card, events in sorted(cards.items())
    ]


def health_section(target: Machine, cards: Mapping[str, Sequence[Recorded]]) -> str:
    """The lines `gpu list` adds under its tables: "" when every GPU is healthy."""
    if not cards:
        return ""
    from rediacc_core.settings import read_settings  # only when a card is held back: its consequence

    held = refuses(read_settings(target))
    consequence = (
        "containers holding them are refused at start"
        if held
        else "shown only: the machine's gpu-health setting is report"
    )
    rows: list[list[object]] = [
        [card, r.event.reason, r.seen_at, r.event.message] for card, events in cards.items() for r in events
    ]
    return "\n".join(
        [
            "",
            f"Unhealthy GPUs ({consequence}; once a card is sound again: "
            f"rdc machine gpu clear {target.name} --device <PCI BUS ID or CDI name>):",
            table(["PCI BUS ID", "EVENT", "SEEN", "MESSAGE"], rows),
        ]
    )


def bus_ids_named(text: str, buses: set[str]) -> set[str]:
    """The bus ids `text` names, in every form a person copies one from: `0000:17:00.0` (the
    inventory's), `0000:17:00` and `PCI:0000:17:00` (the kernel log's, as a driver's event line has it),
    `17:00.0` (lspci's, without the domain)."""
    wanted = text.strip().lower().removeprefix("pci:")
    forms = {wanted, f"0000:{wanted}"}
    return {bus for bus in buses for form in forms if bus == form or bus.startswith(form + ".")}


def cards_of_device(target: Machine, device: str, inventory: Inventory) -> set[str]:
    """The cards `device` names: a PCI bus id of the inventory, or a CDI name reaching cards."""
    from rediacc_core.plugins import get_plugins

    buses = {gpu.pci_bus_id.lower() for gpu in inventory.gpus if gpu.pci_bus_id}
    found = bus_ids_named(device, buses)
    if found:
        return found
    cards = cards_of_name(device, inventory, lambda n: get_plugins().hardware_units(n, inventory) or ())
    if not cards:
        raise ValidationError(
            f"{device!r} names no GPU of machine {target.name}",
            f"give a PCI bus id or a CDI name that `rdc machine gpu list {target.name}` shows",
        )
    return cards


def clear_health(target: Machine, device: str | None) -> list[Recorded]:
    """Clear the events holding back the cards `device` names (None: every card)."""
    from rediacc_core.model import Inventory

    unhealthy(target, scan=True)  # what the log says now is recorded first, then cleared with the rest
    cards = None
    if device is not None:
        cards = cards_of_device(target, device, read_inventory(target) or Inventory())
    return clear(target, cards)
