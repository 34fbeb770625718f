"""Grants held to the machine's facts: the re-check setup and refresh end with, and `rdc repo gpu
confirm`.

A grant names a CDI name and records what it reached (`bindings.py`). After setup or a refresh
writes new specs and a new inventory (both through `setup._record_facts`, the one writer of the
inventory), `recheck_grants` checks every grant of every repo against them. A grant is suspended
when its name is defined by no spec any more, when it reaches other hardware than recorded (two
cards exchanged behind the same indexes), or when it and another repo's grant overlap on the same
hardware while one of them is exclusive (the later one is suspended; both when granted at the same
second). A suspended grant stays recorded and reaches nothing until `confirm_grants` accepts the
hardware it reaches now or a revoke removes it; meanwhile it keeps reserving what it recorded, so a
confirm onto hardware another repo's grant reaches now or recorded, suspended or not, is refused
while one of them is exclusive. A grant whose drift is gone at a later re-check (the cards are
back) is in force again. An older file's grant without a record is bound to what it reaches at the
first re-check.

Every suspension, lift and confirmation is a line in the repo's audit trail (`rdc repo gate log`),
beside the gate's decisions and the handovers.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from rediacc_core.bindings import MOVED, OVERLAP, VANISHED, Suspension, drift
from rediacc_core.cdi.registry import Registry
from rediacc_core.errors import NotFoundError, RefusedError, ValidationError
from rediacc_core.gate.audit.log import append_event
from rediacc_core.grants.records import Grant, read_grants, write_grants
from rediacc_core.grants.units import HardwareUnits, overlapping_units
from rediacc_core.machine import Machine
from rediacc_core.model import Inventory
from rediacc_core.plugins import Plugins
from rediacc_core.repos import Repo, RepoStore, audit_log_path, now_iso
from rediacc_core.statelock import state_lock

# What happened to one grant: suspended, resumed (its drift is gone), bound (an older file's grant
# recorded for the first time), or confirmed (the operator accepted the hardware it reaches now).
SUSPENDED = "suspended"
RESUMED = "resumed"
BOUND = "bound"
CONFIRMED = "confirmed"


@dataclass(frozen=True)
class GrantChange:
    what: str
    grant: Grant  # as it is now
    repo_ref: str


def recheck_grants(
    machine: Machine,
    plugins: Plugins,
    *,
    locked: bool = False,
    inventory: Inventory | None = None,
    dry_run: bool = False,
) -> list[GrantChange]:
    """Check every grant against the machine's specs and inventory as they are now; suspend the
    ones that drifted, lift the ones whose drift is gone, bind the unbound; write and audit it.

    `locked`: the caller holds the machine's state lock already (setup and refresh, between writing
    the inventory and letting go of it, so no grant is ever checked against half new facts).
    `dry_run`: only say what would change, against `inventory` (a dry run's, not written) and the
    specs on the machine now; nothing is written or audited."""
    with nullcontext() if locked or dry_run else state_lock(machine):
        current = read_grants(machine)
        owners = {repo.id: repo for repo in RepoStore(machine).list()}
        defined = Registry.for_machine(machine).names()
        units = HardwareUnits(machine, plugins, inventory=inventory)
        changes, result = _rechecked(machine, current, owners, defined, units)
        if changes and not dry_run:
            write_grants(machine, result)
    if not dry_run:
        _audit(machine, owners, changes)
    return changes


def _rechecked(
    machine: Machine,
    current: Sequence[Grant],
    owners: Mapping[str, Repo],
    defined: frozenset[str],
    units: HardwareUnits,
) -> tuple[list[GrantChange], list[Grant]]:
    """What the re-check changes, and every grant as it is after it."""
    stamp = now_iso()
    found: dict[int, Suspension | None] = {}
    rebound: list[Grant] = []
    for i, grant in enumerate(current):
        if grant.device not in defined:
            found[i] = Suspension(
                VANISHED, f"no CDI spec in {machine.cdi_dir} defines {grant.device} any more", stamp
            )
            rebound.append(grant)
            continue
        reaches = units.binding(grant.device)
        if grant.bound_to is None:  # an older file's grant: recorded as it is now
            rebound.append(dataclasses.replace(grant, bound_to=reaches))
            found[i] = None
            continue
        moved = drift(grant.bound_to, reaches)
        found[i] = Suspension(MOVED, moved, stamp) if moved else None
        rebound.append(grant)
    for i, why in _overlaps(rebound, units, owners).items():
        if found.get(i) is None:
            found[i] = Suspension(OVERLAP, why, stamp)
    changes: list[GrantChange] = []
    result: list[Grant] = []
    for i, grant in enumerate(rebound):
        before, after = current[i].suspended, found.get(i)
        ref = _ref(owners, grant.repo_id)
        if after is not None and before is not None and before.reason == after.reason:
            # The same drift as before: it is suspended since it was first seen.
            after = dataclasses.replace(after, since=before.since)
        new = dataclasses.replace(grant, suspended=after)
        result.append(new)
        if after is not None and after != before:
            changes.append(GrantChange(SUSPENDED, new, ref))
        elif after is None and before is not None:
            changes.append(GrantChange(RESUMED, new, ref))
        elif current[i].bound_to is None and new.bound_to is not None:
            changes.append(GrantChange(BOUND, new, ref))
    return changes, result


def _overlaps(grants: Sequence[Grant], units: HardwareUnits, owners: Mapping[str, Repo]) -> dict[int, str]:
    """Grants of different repos reaching the same hardware while one is exclusive: the later of
    each pair (both at the same second), each with what it overlaps in words."""
    found: dict[int, str] = {}
    for i, a in enumerate(grants):
        for j in range(i + 1, len(grants)):
            b = grants[j]
            if a.repo_id == b.repo_id or not (a.exclusive or b.exclusive):
                continue
            pairs = [] if a.device == b.device else overlapping_units(units(a.device), units(b.device))
            if a.device != b.device and not pairs:
                continue
            where = f" ({pairs[0][0]})" if pairs else ""
            if a.granted_at == b.granted_at:
                suspend = [(i, b), (j, a)]  # no telling which came first: neither reaches it
            else:
                suspend = [(j, a)] if b.granted_at > a.granted_at else [(i, b)]
            for later, other in suspend:
                mode = "exclusively" if other.exclusive else "too"
                found.setdefault(
                    later,
                    f"repo {_ref(owners, other.repo_id)} holds {other.device} {mode}, which reaches the "
                    f"same hardware{where}",
                )
    return found


def confirm_grants(
    machine: Machine,
    plugins: Plugins,
    repo: Repo,
    devices: Sequence[str],
    *,
    lock_timeout: float | None = None,
) -> list[GrantChange]:
    """Bind the repo's grants of `devices` to the hardware their names reach now and lift their
    suspension, all or none. NotFoundError when one is not held, RefusedError when a name is defined
    by no spec any more or accepting it would overlap another repo's grant on the same hardware
    (what that grant's name reaches now, or what it recorded) while one of them is exclusive."""
    wanted = list(dict.fromkeys(devices))
    if not wanted:
        raise ValidationError("no device given", "name each grant to confirm with --device vendor/class=name")
    with state_lock(machine, lock_timeout):
        current = read_grants(machine)
        owners = {r.id: r for r in RepoStore(machine).list()}
        held = {g.device: g for g in current if g.repo_id == repo.id}
        missing = [d for d in wanted if d not in held]
        if missing:
            listing = ", ".join(sorted(held)) or "none"
            raise NotFoundError(
                f"{repo.ref} holds no grant of {', '.join(missing)}; nothing was confirmed",
                f"its grants: {listing} (see `rdc repo gpu list {repo.ref}`)",
            )
        defined = Registry.for_machine(machine).names()
        gone = [d for d in wanted if d not in defined]
        if gone:
            gone_revokes = " and ".join(f"`rdc repo gpu revoke {repo.ref} --device {d}`" for d in gone)
            raise RefusedError(
                f"cannot confirm {', '.join(gone)} for {repo.ref}: no CDI spec in {machine.cdi_dir} "
                "defines it any more, so it reaches no hardware to accept; nothing was confirmed",
                f"revoke it ({gone_revokes}), "
                f"or run `rdc machine setup {machine.name}` once the hardware is back",
            )
        units = HardwareUnits(machine, plugins)
        problems: list[str] = []
        revokes: list[str] = []
        for device in wanted:
            mine = held[device]
            for other in current:
                if other.repo_id == repo.id or not (mine.exclusive or other.exclusive):
                    continue
                # What the other name reaches now, and what its grant recorded (a suspended
                # reservation still reserves the card it was given on, wherever that card is now).
                common = "" if other.device == device else units.in_common(device, other)
                if common is None:
                    continue
                ref = _ref(owners, other.repo_id)
                how = " exclusively" if other.exclusive else ""
                state = " (suspended, still reserving it)" if other.suspended is not None else ""
                problems.append(
                    f"repo {ref} holds {other.device}{how}{state}, which reaches the same hardware as "
                    f"{device}{common}"
                )
                revokes.append(f"`rdc repo gpu revoke {ref} --device {other.device}`")
        if problems:
            raise RefusedError(
                f"cannot confirm {', '.join(wanted)} for {repo.ref}: "
                + "; ".join(problems)
                + "; nothing was confirmed",
                "an exclusive reservation keeps its hardware for one repo: first run "
                + " and ".join(dict.fromkeys(revokes))
                + f", or revoke it here (`rdc repo gpu revoke {repo.ref} --device {wanted[0]}`)",
            )
        confirmed = {
            d: dataclasses.replace(held[d], bound_to=units.binding(d), suspended=None) for d in wanted
        }
        write_grants(machine, [confirmed.get(g.device, g) if g.repo_id == repo.id else g for g in current])
    changes = [GrantChange(CONFIRMED, confirmed[d], repo.ref) for d in wanted]
    _audit(machine, owners, changes)
    return changes


def change_text(change: GrantChange) -> str:
    """One line for a listing, the setup result and the audit trail."""
    grant = change.grant
    if change.what == SUSPENDED and grant.suspended is not None:
        return f"{grant.device} of {change.repo_ref} suspended: {grant.suspended.drift}"
    if change.what == RESUMED:
        return f"{grant.device} of {change.repo_ref} in force again: it reaches what was granted"
    if change.what == CONFIRMED:
        reached = ", ".join(u.text() for u in grant.bound_to or ()) or "no known hardware"
        return f"{grant.device} of {change.repo_ref} confirmed on {reached}"
    return f"{grant.device} of {change.repo_ref} bound to what it reaches now"


def _audit(machine: Machine, owners: Mapping[str, Repo], changes: Sequence[GrantChange]) -> None:
    for change in changes:
        if change.what == BOUND:
            continue  # nothing changed for the repo: its grant reaches what it reached
        repo = owners.get(change.grant.repo_id)
        if repo is None:
            continue
        # The change stands (it is in the grants file); its audit line is best effort.
        with contextlib.suppress(OSError):
            append_event(
                audit_log_path(machine, repo.id),
                {"id": repo.id, "name": repo.name},
                endpoint=f"grant-{change.what}",
                decision=change.what,
                cdi=[change.grant.device],
                message=change_text(change),
            )


def _ref(owners: Mapping[str, Repo], repo_id: str) -> str:
    owner = owners.get(repo_id)
    return owner.ref if owner is not None else f"a deleted repo (id {repo_id})"
