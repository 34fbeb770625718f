"""An exclusive grant against the running parts of other repos: their containers and processes that
hold hardware it would reserve are refused, or (with --stop-holders, --take-over) stopped."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from rediacc_core.errors import RefusedError
from rediacc_core.grants.records import Grant
from rediacc_core.grants.units import HardwareUnits, overlapping_units
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore

if TYPE_CHECKING:
    from rediacc_core.plugins import Plugins
    from rediacc_core.runtime.holdings import Holder
    from rediacc_core.runtime.openers import Node, Opener


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

    def clear_holders(
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

    def clear_openers(
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
