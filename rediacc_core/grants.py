"""GPU grants: which exact CDI device names each repo identity may use on a machine.

A grant names one device exactly: granting `vendor.example/gpu=all` admits that name and never
`vendor.example/gpu=0`. Names are checked against the CDI specs on the machine (the directory the
repo daemons read) and the plugins' own grant rules when written, so a typo is refused rather than
recorded. An exclusive grant reserves the hardware a name reaches for one repo.

The grants live in `<root>/etc/rediacc/gpu/grants.json`, replaced atomically and checked against
`schema/grants.schema.json` on every read. Every check and write happens under the machine's state
lock (`rediacc_core.statelock`), so two grants can never both pass a check the other would fail.

A grant may be a lease (`expires_at`): from its end on it is absent for every reader (the gate, the
runtime guard, these checks) with no process needed to remove it; the next write drops it.

A grant records what its name reached when granted (`bound_to`, see `bindings.py`); setup's re-check
(`recheck.py`) suspends one whose name vanished, moved to other hardware or overlaps another repo's
exclusive reservation. A suspended grant stays in the file (it still reserves, and it is listed) but
reaches nothing: the gate and the runtime guard refuse it until `rdc repo gpu confirm` or a revoke.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rediacc_core import telemetry
from rediacc_core.bindings import Binding, Suspension, binding_from_json, identify, suspension_from_json
from rediacc_core.cdi.names import parse_qualified_name
from rediacc_core.errors import NotFoundError, RefusedError, ValidationError
from rediacc_core.files import (
    LiveFile,
    StatKey,
    parse_json_checked,
    read_text_keyed,
    replace_watched_json,
    restore_hint,
)
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore, now_iso
from rediacc_core.statelock import state_lock

if TYPE_CHECKING:
    from rediacc_core.model import Inventory
    from rediacc_core.plugins import Plugins
    from rediacc_core.runtime.holdings import Holder
    from rediacc_core.runtime.openers import Node, Opener

# Reading grants (every `rdc` read, the gate, the runtime guard) needs only this module's top; what
# granting needs (the CDI registry, plugins) is imported where it is used, and what it asks of the
# machine's running parts (`RunningParts`) is handed in by the caller.

SCHEMA = "grants.schema.json"
SCHEMA_VERSION = 1

_NAME_ONE = "name at least one CDI device with --device vendor/class=name"


@dataclass(frozen=True)
class Grant:
    """One CDI device name granted to one repo identity."""

    repo_id: str
    device: str
    exclusive: bool
    granted_at: str
    expires_at: str | None = None  # a lease's end (UTC, `...Z`); None: until revoked
    bound_to: Binding | None = None  # what the name reached when granted; None: an older file's grant
    suspended: Suspension | None = None

    def in_force(self, now: str) -> bool:
        """False once a lease has ended by `now` (an rdc UTC stamp: text order is time order)."""
        return self.expires_at is None or self.expires_at > now


@dataclass(frozen=True)
class GrantOutcome:
    """What `GrantStore.grant` did for one device. `changed` is False when it was already in force."""

    grant: Grant
    changed: bool
    note: str = ""
    stopped: tuple[Holder, ...] = ()  # containers of other repos stopped to make way (--stop-holders)
    taken: tuple[tuple[str, str], ...] = ()  # (repo ref, device) of the grants --take-over revoked


class RunningParts(Protocol):
    """What an exclusive grant asks of the machine's running parts: who holds the hardware now,
    stopping them, and the handover's audit lines. The records never reach a daemon or /proc
    themselves: the caller hands this in (`runtime.holdings.Holdings`)."""

    def holders(self, repo: Repo) -> list[Holder] | None:
        """The repo's CDI-holding containers; None when its daemon is not running."""

    def stop(self, holder: Holder) -> None: ...

    def openers(self, repo: Repo, nodes: Collection[Node]) -> list[Opener]:
        """The repo's processes holding one of `nodes`, by device number."""

    def nodes_of(self, names: Iterable[str], besides: Iterable[str] = ()) -> set[Node]: ...

    def clear_openers(self, repo: Repo, nodes: Iterable[Node]) -> tuple[list[Holder], list[Opener]]: ...

    def openers_report(self, repo: Repo, left: Iterable[Opener]) -> tuple[list[str], list[str]]: ...

    def stop_command(self, holder: Holder) -> str: ...

    def record_handover(
        self, old: Repo, new: Repo, names: Iterable[str], stopped: Iterable[Holder]
    ) -> None: ...


# --- the file ------------------------------------------------------------------------------------


def parse_grants(text: str, path: Path) -> list[Grant]:
    """The grants in a grants file's text; any problem is a ValidationError naming the file."""
    document = parse_json_checked(text, path, SCHEMA, "grants file")
    grants = [
        Grant(
            entry["repoId"],
            entry["device"],
            entry["exclusive"],
            entry["grantedAt"],
            entry.get("expiresAt"),
            binding_from_json(entry["boundTo"]) if "boundTo" in entry else None,
            suspension_from_json(entry["suspended"]) if "suspended" in entry else None,
        )
        for entry in document["grants"]
    ]
    seen: set[tuple[str, str]] = set()
    for grant in grants:
        key = (grant.repo_id, grant.device)
        if key in seen:
            raise ValidationError(
                f"grants file {path} grants {grant.device} to repo {grant.repo_id} more than once",
                restore_hint(path),
            )
        seen.add(key)
    exclusive = {g.device: g.repo_id for g in grants if g.exclusive}
    for grant in grants:
        holder = exclusive.get(grant.device)
        if holder is not None and holder != grant.repo_id:
            # `rdc repo gpu grant` never writes this; a hand edit did, and the gate must not guess who wins.
            raise ValidationError(
                f"grants file {path} grants {grant.device} to repo {grant.repo_id} although repo {holder} "
                "holds it exclusively",
                restore_hint(path),
            )
    return grants


def _read_file(path: Path) -> tuple[StatKey, list[Grant]] | None:
    """The file's identity and grants, both taken from the same open file; None when there is none."""
    found = read_text_keyed(path, "grants file")
    return None if found is None else (found[0], parse_grants(found[1], path))


def in_force(grants: Iterable[Grant], now: str | None = None) -> list[Grant]:
    """The grants of `grants` in force at `now` (default this moment): the one place a lease that
    has ended stops counting, for every reader (rdc, the gate, housekeeping)."""
    stamp = now or now_iso()
    return [g for g in grants if g.in_force(stamp)]


def reachable(grants: Iterable[Grant], now: str | None = None) -> list[Grant]:
    """The grants of `grants` a container may reach at `now`: in force, and not suspended by
    setup's re-check (the gate, the lease-end housekeeping; the runtime guard reads the same)."""
    return [g for g in in_force(grants, now) if g.suspended is None]


def read_grants(machine: Machine, *, now: str | None = None) -> list[Grant]:
    """Every grant in force on the machine (at `now`, default this moment); [] when none."""
    found = _read_file(machine.grants_path)
    return [] if found is None else in_force(found[1], now)


def suspended_grant(machine: Machine, repo_id: str, device: str) -> Grant | None:
    """The repo's grant of `device` when it is in force but suspended; None otherwise."""
    return next(
        (g for g in read_grants(machine) if g.repo_id == repo_id and g.device == device and g.suspended),
        None,
    )


def confirm_command(repo_ref: str, device: str) -> str:
    return f"rdc repo gpu confirm {repo_ref} --device {device}"


def suspension_text(grant: Grant, repo_ref: str) -> str:
    """`the grant of vendor.example/gpu=0 to repo R is suspended since T: <drift>` (refusals, lists)."""
    held = grant.suspended
    if held is None:
        return ""
    return f"the grant of {grant.device} to repo {repo_ref} is suspended since {held.since}: {held.drift}"


def suspension_advice(grant: Grant, repo_ref: str) -> str:
    """The commands that resolve a suspension, runnable as printed."""
    revoke = f"rdc repo gpu revoke {repo_ref} --device {grant.device}"
    if grant.suspended is not None and grant.suspended.reason == "vanished":
        return f"no spec defines it any more: `{revoke}`, or run setup so a spec defines it again"
    confirm = confirm_command(repo_ref, grant.device)
    return f"to accept the hardware it reaches now: `{confirm}`; or `{revoke}`"


def ended_lease(machine: Machine, repo_id: str, device: str, *, now: str | None = None) -> Grant | None:
    """The repo's lease of `device` that has ended, while the grants file still records it (the
    next change to the file drops it); None when there is none."""
    found = _read_file(machine.grants_path)
    stamp = now or now_iso()
    ended = [
        g
        for g in (found[1] if found else ())
        if g.repo_id == repo_id and g.device == device and not g.in_force(stamp)
    ]
    return max(ended, key=lambda g: g.expires_at or "", default=None)


def write_grants(machine: Machine, grants: Sequence[Grant]) -> None:
    """Replace the grants file; caller holds the state lock."""
    document = {
        "schemaVersion": SCHEMA_VERSION,
        "grants": [
            {
                "repoId": g.repo_id,
                "device": g.device,
                "exclusive": g.exclusive,
                "grantedAt": g.granted_at,
                **({"expiresAt": g.expires_at} if g.expires_at is not None else {}),
                **({"boundTo": [u.to_json() for u in g.bound_to]} if g.bound_to is not None else {}),
                **({"suspended": g.suspended.to_json()} if g.suspended is not None else {}),
            }
            for g in grants
        ],
    }
    replace_watched_json(machine.grants_path, document)  # LiveGrants must see every write as a change
    stamp = now_iso()
    telemetry.export(machine, [g for g in grants if g.in_force(stamp)])  # best effort, see telemetry


def drop_repo_grants(machine: Machine, repo_id: str) -> int:
    """Remove every grant of `repo_id`; the caller holds the state lock. Returns how many went."""
    grants = read_grants(machine)
    kept = [g for g in grants if g.repo_id != repo_id]
    if len(kept) != len(grants):
        write_grants(machine, kept)
    return len(grants) - len(kept)


def delete_repo(machine: Machine, repo: Repo, *, lock_timeout: float | None = None) -> int:
    """Delete the repo and its grants (all under one lock); returns how many grants went with it."""
    return RepoStore(machine, lock_timeout=lock_timeout).delete(repo, drop_repo_grants)


def prune_orphans(machine: Machine, *, lock_timeout: float | None = None) -> list[Grant]:
    """Remove the grants of repos that no longer exist on the machine; returns what went.

    A repo deleted by hand from repos.json (or by an older rdc) leaves them behind, still reserving
    hardware when exclusive.
    """
    with state_lock(machine, lock_timeout):
        known = {repo.id for repo in RepoStore(machine).list()}
        grants = read_grants(machine)
        orphans = [g for g in grants if g.repo_id not in known]
        if orphans:
            write_grants(machine, [g for g in grants if g.repo_id in known])
    return orphans


# --- hardware overlap ----------------------------------------------------------------------------


def units_overlap(a: str, b: str) -> bool:
    """Two hardware units overlap when equal or when one contains the other (`pci:X` holds `pci:X/mig:1`)."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def overlapping_units(first: Iterable[str], second: Iterable[str]) -> list[tuple[str, str]]:
    others = list(second)
    return [(a, b) for a in first for b in others if units_overlap(a, b)]


class HardwareUnits:
    """Hardware units per name, asking the plugins once per name and loading the inventory only if needed."""

    def __init__(self, machine: Machine, plugins: Plugins) -> None:
        self.machine = machine
        self.plugins = plugins
        self._inventory: Inventory | None = None
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


# --- checking and changing -----------------------------------------------------------------------


class GrantStore:
    """The grants of one machine: reading, and grant/revoke with every check under the state lock."""

    def __init__(
        self,
        machine: Machine,
        plugins: Plugins | None = None,
        *,
        lock_timeout: float | None = None,
        running: RunningParts | None = None,
    ) -> None:
        """`running` is needed to grant exclusively (who holds the hardware now); reading, plain
        grants, renewals and revokes do without."""
        self.machine = machine
        from rediacc_core.plugins import get_plugins

        self.plugins = plugins if plugins is not None else get_plugins()
        self.lock_timeout = lock_timeout
        self._running = running

    @property
    def running(self) -> RunningParts:
        if self._running is None:
            raise RuntimeError("an exclusive grant needs the machine's running parts: GrantStore(running=)")
        return self._running

    def all(self) -> list[Grant]:
        return read_grants(self.machine)

    def for_repo(self, repo_id: str) -> list[Grant]:
        return sorted((g for g in self.all() if g.repo_id == repo_id), key=lambda g: g.device)

    # --- grant ---------------------------------------------------------------------------------
    def grant(
        self,
        repo: Repo,
        devices: Sequence[str],
        exclusive: bool = False,
        *,
        stop_holders: bool = False,
        take_over: bool = False,
        expires_at: str | None = None,
    ) -> list[GrantOutcome]:
        """Grant every name in `devices` to `repo`, or none of them.

        ValidationError (exit 2) for a malformed or undefined name, RefusedError (exit 4) when an
        exclusive grant is in the way, or when an exclusive grant would reserve hardware that a
        running container of another repo holds (unless `stop_holders`: then those containers are
        stopped first, under the same lock), BusyError (exit 15) when the lock cannot be had.
        With `take_over` (a handover in one step) the other repos' grants in the way are revoked
        and their holders stopped, under the same lock, instead of refusing.
        """
        wanted = _unique(devices)
        stopped: tuple[Holder, ...] = ()
        taken: list[Grant] = []
        with state_lock(self.machine, self.lock_timeout):
            owners = self._owners(repo)
            self._check_names(wanted)
            current = read_grants(self.machine)
            conflicts = self._conflicts(repo, wanted, exclusive, current, owners)
            if conflicts and not take_over:
                raise self._refusal(repo, wanted, exclusive, conflicts, owners)
            taken = list(dict.fromkeys(other for other, _ in conflicts))
            current = [g for g in current if g not in taken]
            if exclusive:
                stop = stop_holders or take_over
                stopped = self._clear_holders(repo, wanted, owners, stop)
                stopped += self._clear_openers(repo, wanted, owners, current, stop)
            outcomes: list[GrantOutcome] = []
            result = list(current)
            stamp = now_iso()
            units = HardwareUnits(self.machine, self.plugins)
            for device in wanted:
                held = next((g for g in current if g.repo_id == repo.id and g.device == device), None)
                if held is None:
                    new = Grant(repo.id, device, exclusive, stamp, expires_at, units.binding(device))
                    result.append(new)
                    outcomes.append(GrantOutcome(new, True, stopped=stopped))
                elif exclusive and not held.exclusive:
                    new = dataclasses.replace(held, exclusive=True, granted_at=stamp)
                    result[result.index(held)] = new
                    outcomes.append(GrantOutcome(new, True, "was shared, now exclusive", stopped))
                elif held.exclusive and not exclusive:
                    # Never loosen a reservation as a side effect of a plain grant.
                    outcomes.append(
                        GrantOutcome(
                            held, False, "already granted exclusively; revoke and grant again to share"
                        )
                    )
                else:
                    outcomes.append(GrantOutcome(held, False, _granted_again(repo, held, expires_at)))
            if taken:
                refs = tuple((_owner_ref(owners, g.repo_id), g.device) for g in taken)
                outcomes = [dataclasses.replace(o, taken=refs) for o in outcomes]
            if taken or any(outcome.changed for outcome in outcomes):
                write_grants(self.machine, result)
        handed = {h.repo.id: h.repo for h in stopped}
        handed.update({g.repo_id: owners[g.repo_id] for g in taken if g.repo_id in owners})
        for old in handed.values():
            with contextlib.suppress(OSError):  # the grant stands; its audit line is best effort
                self.running.record_handover(old, repo, wanted, stopped)
        return outcomes

    def _owners(self, repo: Repo) -> dict[str, Repo]:
        """The machine's repos by id, after checking `repo` still exists (it may have just been deleted)."""
        owners = {r.id: r for r in RepoStore(self.machine).list()}
        if repo.id not in owners:
            raise NotFoundError(
                f"repo {repo.ref} no longer exists", f"see the repos with `rdc repo list {self.machine.name}`"
            )
        return owners

    def _check_names(self, devices: Sequence[str]) -> None:
        """Every name well formed, defined by a spec the repo daemons read, and accepted by the plugins."""
        if not devices:
            raise ValidationError("no device given", _NAME_ONE)
        from rediacc_core.cdi.registry import Registry

        registry = Registry.for_machine(self.machine)
        defined = registry.names()
        problems: list[str] = []
        todo = "fix the name and try again; nothing was granted"
        for device in devices:
            try:
                parse_qualified_name(device)
            except ValidationError as exc:
                problems.append(f"{exc.what}{_nearest(device, defined)}")
                todo = f"{exc.todo}; nothing was granted" if exc.todo else todo
                continue
            conflicts = registry.conflicts.get(device)
            if conflicts:
                files = ", ".join(str(path) for path in conflicts)
                problems.append(
                    f"{device} is defined by several spec files at once ({files}), so none is used"
                )
                continue
            if device not in defined:
                where = self.machine.cdi_dir
                problems.append(
                    f"{device} is not defined by any CDI spec in {where}{_nearest(device, defined)}"
                )
                continue
        if problems:
            if not defined:
                name = self.machine.name
                todo = f"no CDI devices are defined on {name}: run `rdc machine setup {name}`"
            broken = registry.errors
            if broken:
                problems.append("spec files that could not be read: " + "; ".join(broken))
            raise ValidationError("; ".join(problems), todo)
        self._check_grantable(devices)

    def _check_grantable(self, devices: Sequence[str]) -> None:
        """Refuse names a spec defines but the last setup or refresh placed on no hardware it found
        (the inventory's `ungrantable`): a grant of one would reach a stale name, not a device."""
        from rediacc_core.inventory import load_inventory

        document = load_inventory(self.machine) or {}
        why = {row["name"]: row["why"] for row in document.get("ungrantable", [])}
        stale = [device for device in devices if device in why]
        if stale:
            name = self.machine.name
            raise RefusedError(
                "; ".join(f"{device} is not grantable on {name}: {why[device]}" for device in stale)
                + "; nothing was granted",
                f"grant a name `rdc machine gpu list {name}` lists as grantable; after changing the hardware "
                f"or its spec, run `rdc machine refresh {name}` (or `rdc machine setup {name}`) first",
            )

    def _conflicts(
        self,
        repo: Repo,
        devices: Sequence[str],
        exclusive: bool,
        current: Sequence[Grant],
        owners: Mapping[str, Repo],
    ) -> list[tuple[Grant, str]]:
        """Other repos' grants an exclusive reservation puts in the way of `devices` (theirs or
        this one), each with what it reaches in common."""
        units = HardwareUnits(self.machine, self.plugins)
        if exclusive:
            unplaced = [device for device in devices if units.unplaced(device)]
            if unplaced:  # fail closed: a reservation must follow hardware, not a string
                name = self.machine.name
                raise RefusedError(
                    f"cannot grant {', '.join(unplaced)} exclusively to {repo.ref}: the machine's inventory "
                    "places it on no hardware it knows, so the reservation could not follow the hardware; "
                    "nothing was granted",
                    f"run `rdc machine setup {name}` so the inventory and the specs agree, then grant again "
                    f"(`rdc machine gpu list {name}` shows which names reach which GPU)",
                )
        found: list[tuple[Grant, str]] = []
        for device in devices:
            for other in current:
                if other.repo_id == repo.id or not (exclusive or other.exclusive):
                    continue  # a repo never blocks itself; two shared grants never block each other
                if other.device == device:
                    why = ""
                elif _kind(device) == _kind(other.device) and (
                    units.unplaced(device) or units.unplaced(other.device)
                ):
                    # An exclusive reservation beside a name of unknown hardware: they may overlap.
                    why = f", and the inventory places {device} or {other.device} on no hardware it knows"
                else:
                    pairs = overlapping_units(units(device), units(other.device))
                    if not pairs:
                        continue
                    why = f", which reaches the same hardware as {device} ({_pair_text(pairs[0])})"
                how = " exclusively" if other.exclusive else ""
                found.append(
                    (other, f"repo {_owner_ref(owners, other.repo_id)} holds {other.device}{how}{why}")
                )
        return found

    def _refusal(
        self,
        repo: Repo,
        devices: Sequence[str],
        exclusive: bool,
        conflicts: Sequence[tuple[Grant, str]],
        owners: Mapping[str, Repo],
    ) -> RefusedError:
        mode = " exclusively" if exclusive else ""
        todo = "an exclusive grant reserves its hardware for one repo"
        revokes = [
            f"`rdc repo gpu revoke {owners[g.repo_id].ref} --device {g.device}`"
            for g, _ in conflicts
            if g.repo_id in owners
        ]
        if revokes:
            names = " ".join(f"--device {d}" for d in devices)
            todo += (
                f"; to move it in one step: `rdc repo gpu grant {repo.ref} {names} --exclusive --take-over`"
                f" (revokes it there and stops its holders), or first run "
                + " and ".join(dict.fromkeys(revokes))
            )
        return RefusedError(
            f"cannot grant {', '.join(devices)}{mode} to {repo.ref}: "
            + "; ".join(why for _, why in conflicts)
            + "; nothing was granted",
            todo,
        )

    def in_the_way(self, repo: Repo, device: str) -> str | None:
        """Why `repo` could not be granted `device` now, or None when it could: the other repos'
        exclusive grants in the way, who holds them and the handover that moves them. Read without
        the state lock: it is advice for a refusal, and `grant` checks again under the lock."""
        owners = {r.id: r for r in RepoStore(self.machine).list()}
        conflicts = self._conflicts(repo, [device], False, self.all(), owners)
        if not conflicts:
            return None
        handover = self._refusal(repo, [device], True, conflicts, owners).todo
        return "; ".join(why for _, why in conflicts) + f" ({handover})"

    def running_holders(
        self, repo: Repo, devices: Sequence[str], owners: Mapping[str, Repo] | None = None
    ) -> list[tuple[Holder, str]]:
        """The running containers of repos other than `repo` that hold hardware `devices` reach,
        each with the name it holds that overlaps."""
        owners = owners if owners is not None else {r.id: r for r in RepoStore(self.machine).list()}
        units = HardwareUnits(self.machine, self.plugins)
        found: list[tuple[Holder, str]] = []
        for other in owners.values():
            if other.id == repo.id:
                continue
            for holder in self.running.holders(other) or ():
                if not holder.running:
                    continue  # a stopped holder cannot start again: it is refused without a grant
                for held in holder.cdi:
                    if any(held == d or overlapping_units(units(held), units(d)) for d in devices):
                        found.append((holder, held))
                        break
        return found

    def _clear_holders(
        self, repo: Repo, devices: Sequence[str], owners: Mapping[str, Repo], stop: bool
    ) -> tuple[Holder, ...]:
        """Refuse an exclusive grant while another repo's container runs with the same hardware, or
        (with `stop`) stop those containers; returns the ones stopped."""
        in_the_way = self.running_holders(repo, devices, owners)
        if not in_the_way:
            return ()
        if not stop:
            listing = "; ".join(
                f"container {h.name} of repo {h.repo.ref} is running with {held}" for h, held in in_the_way
            )
            stop_command = self.running.stop_command
            commands = " and ".join(dict.fromkeys(f"`{stop_command(h)}`" for h, _ in in_the_way))
            what = ", ".join(devices)
            raise RefusedError(
                f"cannot grant {what} exclusively to {repo.ref}: {listing}; nothing was granted",
                f"stop it first ({commands}), or pass --stop-holders to stop it now",
            )
        for holder, _ in in_the_way:
            self.running.stop(holder)
        return tuple(h for h, _ in in_the_way)

    def _clear_openers(
        self,
        repo: Repo,
        devices: Sequence[str],
        owners: Mapping[str, Repo],
        current: Sequence[Grant],
        stop: bool,
    ) -> tuple[Holder, ...]:
        """Refuse an exclusive grant while a process of another repo holds a node of `devices`, or
        (with `stop`) stop the containers of such processes; returns the ones stopped.

        The node is found by its device number, so a descriptor handed to a container that never
        named the device, or opened through a hard link, counts, and so does a process that left its
        container (`docker stop` does not reach it: then only `rdc repo down` does). Nodes the other
        repo may hold through a grant of its own in force (a shared control node) do not count."""
        running = self.running
        stopped: list[Holder] = []
        problems: list[str] = []
        commands: list[str] = []
        for other in owners.values():
            if other.id == repo.id:
                continue
            besides = [g.device for g in current if g.repo_id == other.id]  # read in force
            nodes = running.nodes_of(devices, besides)
            if stop:
                more, left = running.clear_openers(other, nodes)
                stopped += more
            else:
                left = running.openers(other, nodes)
            if left:
                lines, ends = running.openers_report(other, left)
                problems += lines
                commands += ends
        if problems:
            run = " and ".join(f"`{c}`" for c in dict.fromkeys(commands))
            if stop:  # what is left survived its container's stop, or is in none
                todo = f"`docker stop` cannot reach a process outside a container: run {run}, then retry"
            else:
                todo = f"stop them first ({run}), or pass --stop-holders to stop their containers now"
            raise RefusedError(
                f"cannot grant {', '.join(devices)} exclusively to {repo.ref}: "
                + "; ".join(problems)
                + "; nothing was granted",
                todo,
            )
        return tuple(stopped)

    # --- renew ---------------------------------------------------------------------------------
    def renew(self, repo: Repo, devices: Sequence[str], expires_at: str | None) -> list[Grant]:
        """Move the end of the repo's grants of `devices` to `expires_at` (None: make them permanent),
        all or none; NotFoundError when one is not held (a lease already over is not held)."""
        wanted = _unique(devices)
        if not wanted:
            raise ValidationError("no device given", _NAME_ONE)
        if expires_at is not None and expires_at <= now_iso():
            raise ValidationError(f"{expires_at} is not in the future", "give a later --until, or --for")
        with state_lock(self.machine, self.lock_timeout):
            current = read_grants(self.machine)
            granted = self._granted(repo, wanted, current, "renewed")
            renewed = {d: dataclasses.replace(g, expires_at=expires_at) for d, g in granted.items()}
            write_grants(
                self.machine, [renewed.get(g.device, g) if g.repo_id == repo.id else g for g in current]
            )
        return [renewed[d] for d in wanted]

    def _granted(
        self, repo: Repo, wanted: Sequence[str], current: Sequence[Grant], what: str
    ) -> dict[str, Grant]:
        """The repo's grants of `wanted`; NotFoundError naming what it is not granted."""
        granted = {g.device: g for g in current if g.repo_id == repo.id}
        missing = [device for device in wanted if device not in granted]
        if missing:
            listing = ", ".join(sorted(granted)) if granted else "none"
            raise NotFoundError(
                f"{repo.ref} holds no grant of {', '.join(missing)}{_nearest(missing[0], granted)}; "
                f"nothing was {what}",
                f"its grants: {listing} (see `rdc repo gpu list {repo.ref}`)",
            )
        return {device: granted[device] for device in wanted}

    # --- revoke --------------------------------------------------------------------------------
    def revoke(self, repo: Repo, devices: Sequence[str], *, absent_ok: bool = False) -> list[Grant]:
        """Remove the repo's grants of `devices`, all or none; NotFoundError when one is not held
        (with `absent_ok`, only when it is not even a name a CDI spec defines)."""
        wanted = _unique(devices)
        if not wanted:
            raise ValidationError("no device given", _NAME_ONE)
        with state_lock(self.machine, self.lock_timeout):
            current = read_grants(self.machine)
            if absent_ok:
                from rediacc_core.cdi.registry import Registry

                defined = Registry.for_machine(self.machine).names()
                mine = {g.device for g in current if g.repo_id == repo.id}
                self._granted(repo, [d for d in wanted if d in mine or d not in defined], current, "revoked")
                wanted = [d for d in wanted if d in mine]
            granted = self._granted(repo, wanted, current, "revoked")
            removed = [granted[device] for device in wanted]
            write_grants(self.machine, [g for g in current if g not in removed])
        return removed


def _unique(devices: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(devices))


def _kind(name: str) -> str:
    return name.partition("=")[0]


def _owner_ref(owners: Mapping[str, Repo], repo_id: str) -> str:
    owner = owners.get(repo_id)
    return owner.ref if owner is not None else f"a deleted repo (id {repo_id})"


def _granted_again(repo: Repo, held: Grant, expires_at: str | None) -> str:
    """What a grant of a name the repo holds already says: its end is kept, and when the end asked
    for differs (a lease, or none), the renew that moves it; a suspended one, how to resolve it."""
    if held.suspended is not None:
        advice = suspension_advice(held, repo.ref)
        return f"already granted, but suspended ({held.suspended.drift}): {advice}"
    if held.expires_at is None and expires_at is None:
        return "already granted"
    renew = f"rdc repo gpu renew {repo.ref} --device {held.device}"
    if expires_at is None:
        return f"already granted until {held.expires_at}, a lease kept as it is (no end: {renew} --forever)"
    now = f"until {held.expires_at}" if held.expires_at else "with no end"
    return f"already granted {now}, kept as it is (to end it at {expires_at}: {renew} --until {expires_at})"


def _pair_text(pair: tuple[str, str]) -> str:
    a, b = pair
    return a if a == b else f"{a} and {b}"


def _nearest(name: str, names: Iterable[str]) -> str:
    from rediacc_core.cdi.registry import suggest

    close = suggest(name, names)
    return f" (did you mean {', '.join(close[:3])}?)" if close else ""


# --- live reading for the gate -------------------------------------------------------------------


class LiveGrants:
    """The machine's grants as the gate sees them, re-read only when the file changed.

    One `stat` per request is all an unchanged file costs (see `files.LiveFile`). A missing file means
    nothing was ever granted; an unreadable or corrupt one raises, so the gate fails closed.
    """

    def __init__(self, machine: Machine) -> None:
        self.path = machine.grants_path
        path = self.path

        def load() -> tuple[StatKey, tuple[Grant, ...]] | None:
            found = _read_file(path)
            return None if found is None else (found[0], tuple(found[1]))

        self._file: LiveFile[tuple[Grant, ...]] = LiveFile(path, load, (), "grants file")

    @property
    def cache_key(self) -> StatKey | None:
        return self._file.cache_key

    @property
    def reads(self) -> int:
        """How many times the file was parsed (tests check it is not re-read needlessly)."""
        return self._file.reads

    def grants(self) -> tuple[Grant, ...]:
        return self._file.get()

    def for_repo(self, repo_id: str) -> frozenset[str]:
        """The names granted to `repo_id` that a container may reach now: a lease that has ended, or
        a grant setup suspended, is absent at once."""
        return frozenset(g.device for g in reachable(self.grants()) if g.repo_id == repo_id)

    def exclusive_for_repo(self, repo_id: str) -> frozenset[str]:
        return frozenset(g.device for g in reachable(self.grants()) if g.repo_id == repo_id and g.exclusive)
