"""What a CDI name reached when it was granted: the identity of each hardware unit, from the inventory.

A plugin places a name on units (`pci:<bus id>`, a slice `pci:<bus id>/mig:1`; see the
`rdc_hardware_units` hook). A unit says where the hardware sits, not which hardware it is: two cards
that exchange slots keep their units and indexes while the name reaches the other card. So a grant
also records each unit's identity as the inventory tells it: the card's `uuid` attribute beside its
PCI bus id, and for a slice its own uuid, its card's and the slice's instance attributes. When the
same name later reaches other identities, the grant no longer reaches what was granted.

Pure data and comparison: no file, lock or plugin here (ground floor).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # a read (`rdc repo gpu list`) loads grants, not the typed model
    from rediacc_core.model import GpuPartition, Inventory, Scalar


@dataclass(frozen=True)
class UnitIdentity:
    """One hardware unit a name reaches, with what identifies the hardware there."""

    unit: str
    pci_bus_id: str | None = None
    uuid: str | None = None  # the card's, or the slice's own
    parent_uuid: str | None = None  # a slice's card
    instance: tuple[tuple[str, Scalar], ...] = ()  # a slice's instance attributes, sorted

    def key(self) -> tuple[Any, ...]:
        """What must stay equal for this to be the same hardware: its own uuid when known (it
        follows the card wherever it sits), else its card's with the slice's place and instance,
        else only where it sits."""
        if self.uuid:
            return ("uuid", self.uuid.lower(), self.instance)
        if self.parent_uuid:
            return ("slice", self.parent_uuid.lower(), _below_card(self.unit), self.instance)
        return ("unit", self.unit)

    def text(self) -> str:
        """`GPU-1234 at 0000:01:00.0`, `slice 1 (...) of GPU-1234 at ...`, or the unit alone."""
        where = f" at {self.pci_bus_id}" if self.pci_bus_id else ""
        ids = " ".join(f"{k}={v}" for k, v in self.instance)
        if self.parent_uuid or self.instance:
            own = f"{self.uuid} " if self.uuid else ""
            ids = f" ({ids})" if ids else ""
            return f"{own}{_below_card(self.unit)}{ids} of {self.parent_uuid or '?'}{where}"
        return f"{self.uuid}{where}" if self.uuid else self.unit

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "pciBusId": self.pci_bus_id,
            "uuid": self.uuid,
            **({"parentUuid": self.parent_uuid} if self.parent_uuid else {}),
            **({"instance": dict(self.instance)} if self.instance else {}),
        }


Binding = tuple[UnitIdentity, ...]
# What each CDI name reaches, by name, as an inventory records it (its devices' `reaches`).
Reaches = Mapping[str, Binding]

# Why a grant is suspended: its name is defined by no spec any more, it reaches other hardware than
# recorded, or its exclusive reservation overlaps another repo's grant on the same hardware.
VANISHED = "vanished"
MOVED = "moved"
OVERLAP = "overlap"


@dataclass(frozen=True)
class Suspension:
    """A grant that reaches nothing until `rdc repo gpu confirm` or a revoke: why, and since when."""

    reason: str  # VANISHED, MOVED or OVERLAP
    drift: str  # what changed, in words
    since: str  # an rdc UTC stamp

    def to_json(self) -> dict[str, str]:
        return {"reason": self.reason, "drift": self.drift, "since": self.since}


def suspension_from_json(entry: Mapping[str, Any]) -> Suspension:
    return Suspension(entry["reason"], entry["drift"], entry["since"])


def binding_from_json(entries: Iterable[Mapping[str, Any]]) -> Binding:
    return tuple(
        UnitIdentity(
            unit=entry["unit"],
            pci_bus_id=entry.get("pciBusId"),
            uuid=entry.get("uuid"),
            parent_uuid=entry.get("parentUuid"),
            instance=tuple(sorted((entry.get("instance") or {}).items())),
        )
        for entry in entries
    )


def identify(units: Sequence[str], inventory: Inventory) -> Binding:
    """The identity of each unit, sorted by unit (one name, one answer, whatever order it came in)."""
    return tuple(_identity(unit, inventory) for unit in sorted(set(units)))


def drift(recorded: Binding, now: Binding) -> str | None:
    """How `now` differs from `recorded` in words; None when it is the same hardware."""
    if sorted(u.key() for u in recorded) == sorted(u.key() for u in now):
        return None
    was = ", ".join(u.text() for u in recorded) or "no known hardware"
    found = ", ".join(u.text() for u in now) or "no known hardware"
    return f"it was granted on {was} and now reaches {found}"


def units_overlap(a: str, b: str) -> bool:
    """Two hardware units overlap when equal or when one contains the other (`pci:X` holds `pci:X/mig:1`)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def same_hardware(a: UnitIdentity, b: UnitIdentity) -> bool:
    """`a` and `b` are, or share, the same hardware: the same identity, a slice of the card the other
    is, or two slices of one card in the same place. Cards known by uuid are compared by card, so a
    card that moved to another slot is still itself; where an identity is unknown, by place."""
    if a.key() == b.key():
        return True
    card_a, card_b = _card(a), _card(b)
    if card_a and card_b:
        if card_a != card_b:
            return False
        below_a, below_b = a.unit.partition("/")[2], b.unit.partition("/")[2]
        return not below_a or not below_b or units_overlap(below_a, below_b)
    return units_overlap(a.unit, b.unit)


def shared_hardware(first: Binding, second: Binding) -> tuple[UnitIdentity, UnitIdentity] | None:
    """The first pair of `first` and `second` that is the same hardware (see `same_hardware`), or None."""
    return next(((a, b) for a in first for b in second if same_hardware(a, b)), None)


def _card(identity: UnitIdentity) -> str | None:
    """The uuid of the card a unit is or is on, lowercased; None when unknown."""
    card = identity.parent_uuid if "/" in identity.unit else identity.uuid
    return card.lower() if card else None


def _identity(unit: str, inventory: Inventory) -> UnitIdentity:
    if not unit.startswith("pci:"):
        return UnitIdentity(unit)  # no card behind it (`cdi:NAME`, a platform render node)
    bus, _, below = unit[len("pci:") :].partition("/")
    cards = [gpu for gpu in inventory.gpus if (gpu.pci_bus_id or "").lower() == bus]
    card_uuid = next((u for gpu in cards if (u := gpu.str_attribute("uuid"))), None)
    if not below:
        return UnitIdentity(unit, bus, card_uuid)
    index = _slice_index(below)
    part = next((p for gpu in cards for p in gpu.partitions if p.index == index), None)
    if part is not None:
        return UnitIdentity(unit, bus, part.uuid, card_uuid, _instance(part))
    # A slice recorded as a GPU entry of its own (its `partition` attribute), not as a partition.
    entry = next((gpu for gpu in cards if gpu.int_attribute("partition") == index), None)
    own = entry.str_attribute("uuid") if entry is not None else None
    return UnitIdentity(unit, bus, own if own != card_uuid else None, card_uuid)


def _slice_index(below: str) -> int | None:
    _, _, number = below.partition("/")[0].partition(":")
    return int(number) if number.isdigit() else None


def _below_card(unit: str) -> str:
    return unit.partition("/")[2] or unit


def _instance(part: GpuPartition) -> tuple[tuple[str, Scalar], ...]:
    # Only identifiers: sizes and profiles are facts about a slice, not which slice it is.
    return tuple(sorted((k, v) for k, v in part.attributes.items() if k.endswith("Id") and v is not None))
