"""AMD GPU health: the resets amdgpu reports in the kernel log.

amdgpu starts every recovery with `amdgpu 0000:03:00.0: amdgpu: GPU reset begin!` (a ring timeout, a
hung job, a RAS error); a failed one adds `GPU reset(N) failed`. Either is reported as a fatal event
of the card at that address: a card that had to be reset is held back until an operator looked.
"""

from __future__ import annotations

import re

from rediacc_amd.discovery import SOURCE
from rediacc_core import HealthEvent, Inventory, Machine, kernel_log

RESET = re.compile(
    r"amdgpu (?P<bus>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]): (?:amdgpu: )?"
    r"(?P<what>GPU reset begin!|GPU reset(?:\(\d+\))? failed)"
)


def reset_events(lines: list[str]) -> list[HealthEvent]:
    events = []
    for line in lines:
        found = RESET.search(line)
        if found is None:
            continue
        reason = "reset" if found.group("what").endswith("begin!") else "reset-failed"
        events.append(
            HealthEvent(
                pci_bus_id=found.group("bus").lower(),
                reason=reason,
                message=line[found.start() :].strip(),
                key=line.strip(),
            )
        )
    return events


def health(machine: Machine, inventory: Inventory) -> list[HealthEvent]:
    ours = {gpu.pci_bus_id for gpu in inventory.from_source(SOURCE) if gpu.pci_bus_id}
    if not ours:
        return []
    return [event for event in reset_events(kernel_log(machine)) if event.pci_bus_id in ours]
