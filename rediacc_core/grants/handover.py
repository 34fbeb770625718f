"""An exclusive grant against the running parts of other repos: the repos whose containers or
processes hold hardware it would reserve, or that may (residue), are refused, or (with
--stop-holders, --take-over) emptied first (`grants.release`)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from rediacc_core.errors import RefusedError
from rediacc_core.grants.records import Grant
from rediacc_core.grants.release import Emptier, residue_in_the_way, residue_text
from rediacc_core.grants.units import HardwareUnits, overlapping_units
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore

if TYPE_CHECKING:
    from rediacc_core.holders import Holder, Node, Opener
    from rediacc_core.plugins import Plugins


class RunningParts(Emptier, Protocol):
    """What an exclusive grant asks of the machine's running parts: who holds the hardware now,
    emptying a repo (`grants.release.Emptier`), and the handover's audit lines. The records never
    reach a daemon or /proc themselves: the caller hands this in (`runtime.holdings.Holdings`)."""

    def holders(self, repo: Repo) -> list[Holder] | None:
        """The repo's CDI-holding containers; None when its daemon is not running."""

    def openers(self, repo: Repo, nodes: Collection[Node]) -> list[Opener]:
        """The repo's processes holding one of `nodes`, by device number."""

    def nodes_of(self, names: Iterable[str], besides: Iterable[str] = ()) -> set[Node]: ...

    def openers_report(self, repo: Repo, left: Iterable[Opener]) -> tuple[list[str], list[str]]: ...

    def stop_command(self, holder: Holder) -> str: ...

    def record_handover(
        self, old: Repo, new: Repo, names: Iterable[str], stopped: Iterable[Holder]
    ) -> None: ...


class Handover:
    """Who of the other repos holds the hardware an exclusive grant would reserve, refused or stopped."""

    def __init__(self, machine: Machine, plugins: Plugins, running: RunningParts | None) -> None:
        self.machine = machine
        self.plugins = plugins
        self._running = running

    @property
    def running(self) -> RunningParts:
        if self._running is None:
            raise RuntimeError("an exclusive grant needs the machine's running parts: GrantStore(running=)")
        return self._running

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

    def must_empty(
        self,
        repo: Repo,
        devices: Sequence[str],
        owners: Mapping[str, Repo],
        current: Sequence[Grant],
        stop: bool,
    ) -> tuple[list[Repo], set[str]]:
        """The other repos to empty before `devices` are reserved for `repo`: those with a running
        container that holds the same hardware, with a process holding one of its nodes (by device
        number), or with residue of it while they run anything (`grants.release`). Without `stop`,
        any of them refuses the grant. Also the ids of the repos whose residue can go: they run nothing.

        Nodes the other repo may hold through a grant of its own in force (a shared control node) do
        not count; the scans are the visible layer, the residue the rule that needs no scan."""
        empty: dict[str, Repo] = {}
        holders = self.running_holders(repo, devices, owners)
        for holder, _ in holders:
            empty[holder.repo.id] = holder.repo
        if holders and not stop:
            listing = "; ".join(
                f"container {h.name} of repo {h.repo.ref} is running with {held}" for h, held in holders
            )
            stops = " and ".join(dict.fromkeys(f"`{self.running.stop_command(h)}`" for h, _ in holders))
            what = ", ".join(devices)
            raise RefusedError(
                f"cannot grant {what} exclusively to {repo.ref}: {listing}; nothing was granted",
                f"stop it first ({stops}), or pass --stop-holders to stop it now",
            )
        problems: list[str] = []
        commands: list[str] = []
        for other in owners.values():
            if other.id == repo.id:
                continue
            besides = [g.device for g in current if g.repo_id == other.id]  # read in force
            left = self.running.openers(other, self.running.nodes_of(devices, besides))
            if left:
                empty[other.id] = other
                lines, ends = self.running.openers_report(other, left)
                problems += lines
                commands += ends
        if problems and not stop:
            run = " and ".join(f"`{c}`" for c in dict.fromkeys(commands))
            raise RefusedError(
                f"cannot grant {', '.join(devices)} exclusively to {repo.ref}: "
                + "; ".join(problems)
                + "; nothing was granted",
                f"stop them first ({run}), or pass --stop-holders to stop their containers now",
            )
        units = HardwareUnits(self.machine, self.plugins)

        def reaches(name: str) -> bool:
            return any(name == d or overlapping_units(units(name), units(d)) for d in devices)

        busy, idle = residue_in_the_way(self.machine, self.running, repo, reaches, owners)
        if busy and not stop:
            downs = " or ".join(f"`rdc repo down {other.ref}`" for other, _, _ in busy.values())
            raise RefusedError(
                f"cannot grant {', '.join(devices)} exclusively to {repo.ref}: "
                + "; ".join(residue_text(*found) for found in busy.values())
                + "; nothing was granted",
                f"pass --stop-holders to empty it now (every container of it is stopped), or {downs}",
            )
        for other, _, _ in busy.values():
            empty[other.id] = other
        return list(empty.values()), idle

    def nothing_left(
        self, repo: Repo, devices: Sequence[str], emptied: Sequence[Repo], current: Sequence[Grant]
    ) -> None:
        """After emptying: refuse when a process of an emptied repo still holds a node of `devices`
        (one that survived its container's stop, or is in none), by the visible scan."""
        problems: list[str] = []
        commands: list[str] = []
        for other in emptied:
            besides = [g.device for g in current if g.repo_id == other.id]
            left = self.running.openers(other, self.running.nodes_of(devices, besides))
            if left:
                lines, _ = self.running.openers_report(other, left)
                problems += lines
                commands.append(f"rdc repo down {other.ref}")
        if problems:
            run = " and ".join(f"`{c}`" for c in dict.fromkeys(commands))
            raise RefusedError(
                f"cannot grant {', '.join(devices)} exclusively to {repo.ref}: "
                + "; ".join(problems)
                + "; nothing was granted",
                f"`docker stop` cannot reach a process outside a container: run {run}, then retry",
            )
