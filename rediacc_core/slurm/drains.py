"""Health reaches Slurm: a node with a card rdc holds back (a fatal driver event not cleared) is
drained with a reason naming the card (`rdc: GPU-… held (xid-79)`), and so is a node with a card
whose grant setup suspended for drift (`rdc: GPU-… suspended (vanished)`: its name reaches other
hardware than when granted). The node is resumed once every card is clear and every such grant is
confirmed or revoked, but only from a drain of one of these reasons of rdc's: an operator's drain is
never lifted here."""

from __future__ import annotations

from rediacc_core.bindings import MOVED, VANISHED
from rediacc_core.grants.records import read_grants
from rediacc_core.health import read_health, unhealthy_cards
from rediacc_core.machine import Machine
from rediacc_core.slurm import client
from rediacc_core.slurm.gres import GresMap, read_map

HELD_MARK = " held ("  # in every health reason this module drains with, and in no other of rdc's
SUSPENDED_MARK = " suspended ("  # in every drift reason it drains with, and in no other of rdc's


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


def suspended_reason(machine: Machine, found: GresMap) -> str | None:
    """`rdc: GPU-… suspended (vanished)` for the node's cards a grant of which setup suspended."""
    by_name = {e.cdi: e for e in found.entries}
    parts: dict[str, str] = {}
    for grant in read_grants(machine):
        entry = by_name.get(grant.device)
        # Drift only: an overlap's suspended grant leaves the card serving the repo granted first.
        drift = grant.suspended.reason if grant.suspended is not None else None
        if drift in (VANISHED, MOVED) and entry is not None:
            parts.setdefault(grant.device, f"{entry.uuid or grant.device}{SUSPENDED_MARK}{drift})")
    return "rdc: " + "; ".join(parts.values()) if parts else None


def _ours(reason: str) -> bool:
    return reason.startswith("rdc: ") and (HELD_MARK in reason or SUSPENDED_MARK in reason)


def sync(machine: Machine) -> str | None:
    """Drain or resume the machine's node for its cards' health and its grants suspended for
    drift; what it did, or None."""
    found = read_map(machine)
    if found is None:
        return None
    both = (held_reason(machine, found), suspended_reason(machine, found))
    reasons = [r.removeprefix("rdc: ") for r in both if r]
    wanted = "rdc: " + "; ".join(reasons) if reasons else None
    state, reason = client.node_state(machine, found.node)
    drained = "DRAIN" in state.upper()
    if wanted is not None and (not drained or reason != wanted):
        client.drain(machine, found.node, wanted)
        return f"drained {found.node}: {wanted}"
    if wanted is None and drained and _ours(reason):
        client.resume(machine, found.node)
        return f"resumed {found.node}: no card of it is held back or suspended"
    return None
