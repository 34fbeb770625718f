"""Whether the CDI specs on a machine and its inventory agree, checked at setup, refresh and the gate.

Two questions. At setup and `rdc machine refresh`: is every name a spec defines placed on hardware
discovery found? A name a plugin owns that the new inventory places nowhere (a partition after the
layout changed, a name an earlier setup left behind) is recorded as not grantable, with why, so a
grant of it is refused instead of reserving a string. At the gate: were the specs the daemon injects
from rewritten after the inventory was written (a vendor's refresh unit after a driver update)? Then
the inventory's facts are older than the spec and no device request is decided on them.

The identity of the specs is a stat fingerprint (`cdi.registry.fingerprint`: path, inode, mtime,
size per file), recorded in the inventory as `specs` and compared per request: no file is read.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rediacc_core.cdi.registry import Fingerprint, fingerprint

if TYPE_CHECKING:
    from rediacc_core.cdi.registry import Registry
    from rediacc_core.machine import Machine
    from rediacc_core.model import Inventory
    from rediacc_core.plugins import Plugins


def unplaced_names(registry: Registry, inventory: Inventory, plugins: Plugins) -> dict[str, str]:
    """Each defined name a plugin owns but places on no hardware of `inventory`, with why.

    A name no plugin owns (a spec of a vendor rdc has no plugin for) cannot be judged and stays
    grantable, as before.
    """
    found: dict[str, str] = {}
    for name, entry in sorted(registry.devices.items()):
        units = plugins.hardware_units(name, inventory)
        if units and all(unit.startswith("cdi:") for unit in units):
            spec = entry.spec.path.name if entry.spec.path is not None else "a spec"
            found[name] = f"{spec} defines it, but no GPU discovery found on the machine is {name}"
    return found


def recorded(fp: Fingerprint, machine: Machine) -> list[dict[str, Any]]:
    """`fp` as the inventory's `specs` records it: file names relative to the spec dir."""
    base = str(machine.cdi_dir)
    return [
        {"file": _relative(path, base), "inode": inode, "mtimeNs": mtime, "size": size}
        for path, inode, mtime, size in fp
    ]


def _relative(path: str, base: str) -> str:
    return path[len(base) + 1 :] if path.startswith(base + "/") else path


def from_record(rows: Sequence[Mapping[str, Any]], machine: Machine) -> Fingerprint:
    base = str(machine.cdi_dir)
    return tuple(
        (f"{base}/{row['file']}", int(row["inode"]), int(row["mtimeNs"]), int(row["size"])) for row in rows
    )


def changes(old: Fingerprint, new: Fingerprint, machine: Machine) -> list[str]:
    """The spec files that differ between two fingerprints, as `vendor.yaml changed` phrases."""
    base = str(machine.cdi_dir)
    before = {row[0]: row for row in old}
    after = {row[0]: row for row in new}
    said = []
    for path in sorted(before.keys() | after.keys()):
        name = _relative(path, base)
        if path not in before:
            said.append(f"{name} appeared")
        elif path not in after:
            said.append(f"{name} was removed")
        elif before[path] != after[path]:
            said.append(f"{name} changed")
    return said


class SpecAge:
    """For the gate: None while the specs are those the inventory was written from, else why not.

    Per call: a `stat` of the spec dir and of each spec file, no directory listing (`recorded_specs`
    hands in the rows of the inventory read the caller made anyway).
    A file added, removed or renamed in (an atomic rewrite) changes the dir's mtime; a file written
    in place changes its own; either makes the next call list the dir again. An inventory that
    records no `specs` (written by an rdc before this check) is not judged. Thread-safe.
    """

    def __init__(
        self, machine: Machine, recorded_specs: Callable[[], Sequence[Mapping[str, Any]] | None]
    ) -> None:
        self.machine = machine
        self._dir = machine.cdi_dir  # computed once: the property costs as much as a stat
        self._recorded = recorded_specs  # the inventory's `specs` rows; None when it records none
        self._lock = threading.Lock()
        # (the rows judged, the dir's stat, the specs' fingerprint then, the answer)
        self._last: tuple[object, tuple[int, int], Fingerprint, str | None] | None = None

    def check(self) -> str | None:
        rows = self._recorded()
        if rows is None:
            return None
        directory = self._dir
        last = self._last
        if last is not None and last[0] is rows and _dir_key(directory) == last[1] and _same(last[2]):
            return last[3]
        with self._lock:
            dir_key = _dir_key(directory)  # before the listing: a change during it is seen next time
            now = fingerprint([directory])
            then = from_record(rows, self.machine)
            why = None
            if then != now:
                what = ", ".join(changes(then, now, self.machine)) or "the spec files changed"
                why = (
                    f"the CDI specs in {directory} changed after the machine's inventory was written "
                    f"({what}): its GPU facts (driver versions, partitions) may be older than the "
                    "devices the daemon would inject"
                )
            self._last = (rows, dir_key, now, why)
        return why


def _dir_key(directory: Path) -> tuple[int, int]:
    try:
        st = os.stat(directory)
    except OSError:
        return (-1, -1)
    return (st.st_ino, st.st_mtime_ns)


def _same(fp: Fingerprint) -> bool:
    """Every file of `fp` still has the inode, mtime and size it had."""
    for path, inode, mtime, size in fp:
        try:
            st = os.stat(path)
        except OSError:
            if inode != -1:
                return False
            continue
        if (st.st_ino, st.st_mtime_ns, st.st_size) != (inode, mtime, size):
            return False
    return True


# Facts a setup may fail to read that an earlier one had (a vendor tool gone, discovery from /proc).
_FACTS = (("memoryMiB", "memory"), ("driverVersion", "driver version"))


def lost_facts(previous: Mapping[str, Any] | None, now: Mapping[str, Any]) -> list[str]:
    """One sentence per card whose facts the previous inventory had and this discovery could not
    read (same plugin, same PCI bus id). They are not carried over: a fact read before may be what
    changed (a MIG layout, a driver), and the gate must not decide on it."""
    if previous is None:
        return []
    before = {(g.get("source"), g.get("pciBusId")): g for g in previous.get("gpus", []) if g.get("pciBusId")}
    said = []
    for gpu in now.get("gpus", []):
        old = before.get((gpu.get("source"), gpu.get("pciBusId")))
        if old is None:
            continue
        missing = [word for key, word in _FACTS if old.get(key) is not None and gpu.get(key) is None]
        missing += [
            key
            for key, value in (old.get("attributes") or {}).items()
            if value is not None and (gpu.get("attributes") or {}).get(key) is None
        ]
        if old.get("partitions") and not gpu.get("partitions"):
            names = [n for p in old["partitions"] for n in p.get("cdiNames", [])[:1]]
            missing.append(f"{len(old['partitions'])} partition(s) ({', '.join(names) or 'unnamed'})")
        if missing:
            card = f"{gpu.get('name')} at {gpu.get('pciBusId')}"
            said.append(
                f"discovery ({gpu.get('source')}) could not read {', '.join(missing)} of {card} this time, "
                "which the previous inventory had; they are recorded as unknown, not carried over, and "
                "names that need them are not grantable"
            )
    return said
