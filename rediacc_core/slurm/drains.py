"""Health reaches Slurm: a node with a card rdc holds back (a fatal driver event not cleared) is
drained with a reason naming the card (`rdc: GPU-… held (xid-79)`), and resumed once every card is
clear, but only from a drain of rdc's own health reason: an operator's drain is never lifted here."""

from __future__ import annotations

from rediacc_core.health import read_health, unhealthy_cards
from rediacc_core.machine import Machine
from rediacc_core.slurm import client
from rediacc_core.slurm.gres import GresMap, read_map

HELD_MARK = " held ("  # in every reason this module drains with, and in no other of rdc's


def held_reason(machine: Machine, found: GresMap, cards: set[str] | None = None) -> str | None:
    """`rdc: GPU-… held (xid-79)` for the node's cards held back (of `cards` only, when given)."""
    unhealthy = unhealthy_cards(read_health(machine))
    parts: dict[str, str] = {}
    for entry in found.entries:
        bus = (entry.pci_bus_id or "").lower()
        if bus in unhealthy and (cards is None or bus in cards):
            reasons = ", ".join(dict.fromkeys(r.event.reason for r in unhealthy[bus]))
            parts.setdefault(bus, f"{entry.uuid or bus}{HELD_MARK}{reasons})")
    return "rdc: " + "; ".join(parts.values()) if parts else None


def sync(machine: Machine) -> str | None:
    """Drain or resume the machine's node for its cards' health; what it did, or None."""
    found = read_map(machine)
    if found is None:
        return None
    wanted = held_reason(machine, found)
    state, reason = client.node_state(machine, found.node)
    drained = "DRAIN" in state.upper()
    if wanted is not None and (not drained or reason != wanted):
        client.drain(machine, found.node, wanted)
        return f"drained {found.node}: {wanted}"
    if wanted is None and drained and reason.startswith("rdc: ") and HELD_MARK in reason:
        client.resume(machine, found.node)
        return f"resumed {found.node}: no card of it is held back"
    return None
