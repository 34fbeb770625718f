"""GPU health records: the events vendor plugins reported, and which cards they hold back.

Plugins report what their drivers said (`rdc_health`: faults, memory errors, resets); the
core records each event once per card and key in `<root>/etc/rediacc/gpu/health.json` (checked
against `schema/health.schema.json` on every read) under the machine's state lock. A card with a
fatal event not cleared is unhealthy: `rdc machine gpu list` shows it, the GPU metrics count it and,
unless the machine's `gpu-health` setting is `report`, a repo gate refuses to start a container
holding a name that reaches it, until `rdc machine gpu clear`. Clearing marks the card's events
cleared rather than forgetting them, so the same log line read again never holds the card back again.

This module is records only: the events come in through a callable the caller hands in (the
plugins' hook), and the names a card's hold reaches through the hardware units the caller knows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rediacc_core.errors import RdcError
from rediacc_core.files import (
    LiveFile,
    StatKey,
    atomic_write_text,
    parse_json_checked,
    read_text_keyed,
    replace_watched_json,
)
from rediacc_core.inventory import read_inventory
from rediacc_core.machine import Machine
from rediacc_core.repos import now_iso
from rediacc_core.setting import Setting
from rediacc_core.statelock import state_lock

if TYPE_CHECKING:
    from rediacc_core.model import Gpu, HealthEvent, Inventory

# `rdc machine gpu list` reads the records without the model (a read imports only what it shows);
# the dataclasses are imported where events are made.

SCHEMA = "health.schema.json"
SCHEMA_VERSION = 1
WHAT = "GPU health file"
GPU_HEALTH = Setting(
    "gpu-health",
    ("refuse", "report"),
    "refuse",
    "a GPU whose driver reported a fatal event (a fault, an uncorrectable memory error, a "
    "reset): refuse to start containers holding it until `rdc machine gpu clear`, or only "
    "report it (gpu list, metrics)",
)
# Cleared events are kept so a log line read again stays cleared; the oldest cleared go past this.
MAX_EVENTS = 2000

# The hardware units a CDI name reaches (`Plugins.hardware_units` with the inventory bound).
UnitsOf = Callable[[str], Sequence[str]]


@dataclass(frozen=True)
class Recorded:
    """One event as the machine recorded it."""

    event: HealthEvent
    seen_at: str
    cleared_at: str | None = None

    @property
    def holds(self) -> bool:
        """True while this event holds its card back: fatal, and not cleared."""
        return self.event.fatal and self.cleared_at is None


def health_path(machine: Machine) -> Path:
    return machine.gpu_dir / "health.json"


def parse_health(text: str, path: Path) -> list[Recorded]:
    from rediacc_core.model import HealthEvent

    document = parse_json_checked(text, path, SCHEMA, WHAT)
    return [
        Recorded(
            HealthEvent(
                pci_bus_id=entry["pciBusId"],
                reason=entry["reason"],
                message=entry["message"],
                fatal=entry["fatal"],
                key=entry["key"],
            ),
            entry["seenAt"],
            entry.get("clearedAt"),
        )
        for entry in document["events"]
    ]


def _read_file(path: Path) -> tuple[StatKey, list[Recorded]] | None:
    found = read_text_keyed(path, WHAT)
    return None if found is None else (found[0], parse_health(found[1], path))


def read_health(machine: Machine) -> list[Recorded]:
    """Every recorded event ([] when none was ever reported)."""
    found = _read_file(health_path(machine))
    return [] if found is None else found[1]


def _write(machine: Machine, records: Sequence[Recorded]) -> None:
    if len(records) > MAX_EVENTS:
        cleared = [r for r in records if not r.holds][: len(records) - MAX_EVENTS]
        records = [r for r in records if r not in cleared]
    document: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "heldNames": names_held_back(machine, unhealthy_cards(records)),
        "events": [
            {
                "pciBusId": r.event.pci_bus_id,
                "reason": r.event.reason,
                "message": r.event.message,
                "fatal": r.event.fatal,
                "key": r.event.identity,
                "seenAt": r.seen_at,
                **({"clearedAt": r.cleared_at} if r.cleared_at else {}),
            }
            for r in records
        ],
    }
    replace_watched_json(health_path(machine), document)
    # Best effort, as the gates' metrics: the records above are what holds a card back.
    with contextlib.suppress(OSError):
        atomic_write_text(metrics_path(machine), metrics_text(records))


def metrics_path(machine: Machine) -> Path:
    """Beside the gates' files, for node_exporter's textfile collector."""
    return machine.run_dir / "metrics" / "gpu-health.prom"


def metrics_text(records: Iterable[Recorded]) -> str:
    records = list(records)
    counts: dict[tuple[str, str, bool], int] = {}
    for r in records:
        key = (r.event.pci_bus_id, r.event.reason, r.event.fatal)
        counts[key] = counts.get(key, 0) + 1
    out = [
        "# HELP rediacc_gpu_health_events Health events a GPU's driver reported, as recorded (cleared too).",
        "# TYPE rediacc_gpu_health_events gauge",
        *(
            f'rediacc_gpu_health_events{{pci_bus_id="{bus}",reason="{reason}",'
            f'fatal="{str(fatal).lower()}"}} {n}'
            for (bus, reason, fatal), n in sorted(counts.items())
        ),
        "# HELP rediacc_gpu_unhealthy 1 for a GPU a fatal event holds back until `rdc machine gpu clear`.",
        "# TYPE rediacc_gpu_unhealthy gauge",
        *(f'rediacc_gpu_unhealthy{{pci_bus_id="{bus}"}} 1' for bus in sorted(unhealthy_cards(records))),
    ]
    return "\n".join(out) + "\n"


def names_held_back(machine: Machine, cards: Iterable[str]) -> list[str]:
    """The CDI names of the cards held back, for the runtime guard (which reads no inventory): each
    name a GPU on such a card lists, less those a GPU on a healthy card lists too (a kind's `all`)."""
    from rediacc_core.model import Inventory

    held = set(cards)
    try:
        inventory = read_inventory(machine) or Inventory()
    except RdcError:  # the gate's check, which reads the inventory itself, still holds
        return []

    def names(gpu: Gpu) -> set[str]:
        return {*gpu.cdi_names, *(n for part in gpu.partitions for n in part.cdi_names)}

    on_held = [names(g) for g in inventory.gpus if (g.pci_bus_id or "").lower() in held]
    elsewhere = [names(g) for g in inventory.gpus if (g.pci_bus_id or "").lower() not in held]
    return sorted(set().union(*on_held) - set().union(*elsewhere))


def record_events(machine: Machine, events: Iterable[HealthEvent]) -> list[Recorded]:
    """Record the events not seen before; returns every recorded event afterwards."""
    events = list(events)
    records = read_health(machine)
    known = {(r.event.pci_bus_id, r.event.identity) for r in records}
    if all((e.pci_bus_id, e.identity) in known for e in events):
        return records  # the usual case: nothing new, no lock, no write
    with state_lock(machine):
        records = read_health(machine)
        known = {(r.event.pci_bus_id, r.event.identity) for r in records}
        stamp = now_iso()
        for event in events:
            if (event.pci_bus_id, event.identity) not in known:
                known.add((event.pci_bus_id, event.identity))
                records.append(Recorded(replace(event, key=event.identity), stamp))
        _write(machine, records)
    return records


def clear(machine: Machine, cards: Iterable[str] | None = None) -> list[Recorded]:
    """Clear the events holding `cards` back (None: every card); returns the events cleared."""
    wanted = None if cards is None else set(cards)
    with state_lock(machine):
        records = read_health(machine)
        stamp = now_iso()
        cleared = [r for r in records if r.holds and (wanted is None or r.event.pci_bus_id in wanted)]
        if cleared:
            _write(machine, [replace(r, cleared_at=stamp) if r in cleared else r for r in records])
    return cleared


def unhealthy_cards(records: Iterable[Recorded]) -> dict[str, list[Recorded]]:
    """Card (PCI bus id) -> the events holding it back, for the cards some event holds back."""
    cards: dict[str, list[Recorded]] = {}
    for record in records:
        if record.holds:
            cards.setdefault(record.event.pci_bus_id, []).append(record)
    return cards


def cards_of_name(name: str, inventory: Inventory, units: UnitsOf | None = None) -> set[str]:
    """The cards (PCI bus ids) a CDI name reaches: through its hardware units (`pci:BUS[/...]`) when
    a plugin places it, else through every GPU of the inventory listing it."""
    found: set[str] = {
        u.split("/", 1)[0].removeprefix("pci:")
        for u in (units(name) if units else ())
        if u.startswith("pci:")
    }
    if found:
        return found
    cards = set()
    for gpu in inventory.gpus:
        names = [*gpu.cdi_names, *(n for part in gpu.partitions for n in part.cdi_names)]
        if name in names and gpu.pci_bus_id:
            cards.add(gpu.pci_bus_id.lower())
    return cards


def refuses(settings: dict[str, str] | Any) -> bool:
    """Whether the machine's settings hold unhealthy cards back (the default) or only report them."""
    return str(settings.get(GPU_HEALTH.name, GPU_HEALTH.default)) != "report"


class LiveHealth:
    """The machine's health records as the gate sees them, re-read only when the file changed; an
    unreadable file raises, for the caller to fail closed."""

    def __init__(self, machine: Machine) -> None:
        path = health_path(machine)

        def load() -> tuple[StatKey, tuple[Recorded, ...]] | None:
            found = _read_file(path)
            return None if found is None else (found[0], tuple(found[1]))

        self._file: LiveFile[tuple[Recorded, ...]] = LiveFile(path, load, (), WHAT)

    def unhealthy(self) -> dict[str, list[Recorded]]:
        return unhealthy_cards(self._file.get())
