"""The gate's look at GPU health before a container holding devices starts.

Each such start asks the plugins for their health events (`rdc_health`), records the new ones
(`rediacc_core.health`), and returns the cards some fatal event holds back; the decider refuses a
start whose CDI names reach one of them, unless the machine's `gpu-health` setting is `report`.
Reading the kernel's log blocks, so this runs only in a decision's worker thread (`may_block`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rediacc_core.blocking import may_block
from rediacc_core.health import Recorded, cards_of_name, record_events, unhealthy_cards
from rediacc_core.model import Inventory, Refusal

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.plugins import Plugins

# The cards (PCI bus ids) held back now, each with the events holding it.
HealthReader = Callable[[], Mapping[str, Sequence[Recorded]]]


def live_health(
    machine: Machine, plugins: Plugins, inventory: Callable[[], Inventory | None], log: Callable[[str], None]
) -> HealthReader:
    """A reader that brings the records up to date from the plugins, then answers from them. A
    plugin that fails is logged and the records it left stand; unreadable records raise."""

    def read() -> Mapping[str, Sequence[Recorded]]:
        may_block()
        found = inventory()
        events = []
        if found is not None:
            try:
                events = plugins.health(machine, found)
            except Exception as exc:  # one plugin's failure must not open the cards it reported before
                log(f"GPU health not read: {type(exc).__name__}: {exc}")
        return unhealthy_cards(record_events(machine, events))

    return read


def health_refusals(
    container: str | None,
    names: Sequence[str],
    cards: Mapping[str, Sequence[Recorded]],
    inventory: Inventory,
    units: Callable[[str], Sequence[str]],
    machine_name: str,
) -> list[Refusal]:
    """A refusal per CDI name of `container` (None: of a create) that reaches a card held back."""
    refusals = []
    for name in names:
        for card in sorted(cards_of_name(name, inventory, units) & set(cards)):
            events = cards[card]
            latest = events[-1].event
            more = f" and {len(events) - 1} more event(s)" if len(events) > 1 else ""
            reported = f"its driver reported {latest.reason} ({latest.message}){more}"
            clear = (
                f"once the card is sound again, an operator's `rdc machine gpu clear {machine_name} "
                f"--device {name}` (`rdc machine gpu list {machine_name}` shows its events)"
            )
            if container is None:
                message = f"{name} reaches the GPU at {card}: {reported}, so no container may start with it"
                instead = f"{clear}; or another GPU"
            else:
                message = f"container {container} holds {name}, which reaches the GPU at {card}: {reported}, "
                message += "so it may not start"
                instead = f"{clear}; or `docker rm {container}` and create it with another GPU"
            refusals.append(Refusal(message=message, replacement=instead, rule="gpu-health"))
    return refusals
