"""What a grant is checked against, under the state lock: the repo still exists, each name is well
formed, defined by exactly one spec and grantable, and no other repo's grant is in the way of an
exclusive reservation (by name, by the hardware the names reach, or by the hardware another grant
recorded)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rediacc_core.cdi.names import parse_qualified_name
from rediacc_core.errors import NotFoundError, RefusedError, ValidationError
from rediacc_core.grants.records import Grant
from rediacc_core.grants.units import HardwareUnits
from rediacc_core.inventory import load_inventory
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore

if TYPE_CHECKING:
    from rediacc_core.plugins import Plugins

NAME_ONE = "name at least one CDI device with --device vendor/class=name"


class GrantChecks:
    """The checks of one machine's grants; each refusal says what to do and that nothing was granted."""

    def __init__(self, machine: Machine, plugins: Plugins) -> None:
        self.machine = machine
        self.plugins = plugins

    def owners(self, repo: Repo) -> dict[str, Repo]:
        """The machine's repos by id, after checking `repo` still exists (it may have just been deleted)."""
        owners = {r.id: r for r in RepoStore(self.machine).list()}
        if repo.id not in owners:
            raise NotFoundError(
                f"repo {repo.ref} no longer exists", f"see the repos with `rdc repo list {self.machine.name}`"
            )
        return owners

    def names(self, devices: Sequence[str]) -> None:
        """Every name well formed, defined by a spec the repo daemons read, and accepted by the plugins."""
        if not devices:
            raise ValidationError("no device given", NAME_ONE)
        from rediacc_core.cdi.registry import Registry

        registry = Registry.for_machine(self.machine)
        defined = registry.names()
        problems: list[str] = []
        todo = "fix the name and try again; nothing was granted"
        for device in devices:
            try:
                parse_qualified_name(device)
            except ValidationError as exc:
                problems.append(f"{exc.what}{nearest(device, defined)}")
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
                    f"{device} is not defined by any CDI spec in {where}{nearest(device, defined)}"
                )
                continue
        if problems:
            if not defined:
                name = self.machine.name
                todo = (
                    f"machine {name} has no GPU that a CDI spec names (its setup found none): grant "
                    "on a machine that has one (`rdc machine gpu list --all`)"
                    if self.machine.inventory_path.exists()  # set up already: setup again finds none
                    else f"no CDI devices are defined on {name}: run `rdc machine setup {name}`"
                )
            broken = registry.errors
            if broken:
                problems.append("spec files that could not be read: " + "; ".join(broken))
            raise ValidationError("; ".join(problems), todo)
        self.grantable(devices)

    def grantable(self, devices: Sequence[str]) -> None:
        """Refuse names a spec defines but the last setup or refresh placed on no hardware it found
        (the inventory's `ungrantable`): a grant of one would reach a stale name, not a device."""
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

    def conflicts(
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
                    # What the other name reaches now, or the hardware its grant recorded (a
                    # suspended reservation keeps the card it was given on).
                    common = units.in_common(device, other)
                    if common is None:
                        continue
                    why = f", which reaches the same hardware as {device}{common}"
                how = " exclusively" if other.exclusive else ""
                found.append(
                    (other, f"repo {owner_ref(owners, other.repo_id)} holds {other.device}{how}{why}")
                )
        return found

    def refusal(
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
            taken = "; ".join(
                f"{g.device} of repo {owners[g.repo_id].ref}"
                for g in dict.fromkeys(g for g, _ in conflicts)
                if g.repo_id in owners
            )
            todo += (
                f"; to move it in one step: `rdc repo gpu grant {repo.ref} {names} --exclusive --take-over`"
                f" (revokes {taken} and stops every container of those repos first), or first run "
                + " and ".join(dict.fromkeys(revokes))
            )
        return RefusedError(
            f"cannot grant {', '.join(devices)}{mode} to {repo.ref}: "
            + "; ".join(why for _, why in conflicts)
            + "; nothing was granted",
            todo,
        )

    def unlisted(
        self, repo: Repo, devices: Sequence[str], unlisted: Sequence[Grant], owners: Mapping[str, Repo]
    ) -> RefusedError:
        """A take-over that found a grant in the way it had not listed (granted meanwhile)."""
        names = " ".join(f"--device {d}" for d in devices)
        return RefusedError(
            f"cannot take {', '.join(devices)} over for {repo.ref}: "
            + "; ".join(f"repo {owner_ref(owners, g.repo_id)} holds {g.device}" for g in unlisted)
            + ", which the take-over did not list; nothing was granted or revoked",
            f"run `rdc repo gpu grant {repo.ref} {names} --exclusive --take-over` again to see the list",
        )


def _kind(name: str) -> str:
    return name.partition("=")[0]


def owner_ref(owners: Mapping[str, Repo], repo_id: str) -> str:
    owner = owners.get(repo_id)
    return owner.ref if owner is not None else f"a deleted repo (id {repo_id})"


def nearest(name: str, names: Iterable[str]) -> str:
    from rediacc_core.cdi.registry import suggest

    close = suggest(name, names)
    return f" (did you mean {', '.join(close[:3])}?)" if close else ""
