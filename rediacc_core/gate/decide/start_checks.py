"""The checks on a request that would make a container run: the CDI names it holds must still be
granted (and not suspended), the GPUs they reach healthy, and its published ports still allowed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from rediacc_core.errors import RdcError
from rediacc_core.gate.decide.allowances import AllowanceReader
from rediacc_core.gate.decide.containers import Container, ContainerLookup, ContainerRemover, LookupFailed
from rediacc_core.gate.decide.decision import Refuse, refuse
from rediacc_core.gate.decide.health_check import HealthReader, health_refusals
from rediacc_core.gate.decide.live_facts import LiveFacts
from rediacc_core.gate.policy import publish
from rediacc_core.gate.policy.endpoints import Route, path_id
from rediacc_core.gate.wire.decode import Target
from rediacc_core.grants.records import ended_lease, suspended_grant, suspension_advice, suspension_text
from rediacc_core.grants.store import GrantStore
from rediacc_core.health import refuses as refuses_unhealthy
from rediacc_core.model import Inventory, Refusal

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.plugins import Plugins
    from rediacc_core.repos import Repo


def in_the_way(machine: Machine, plugins: Plugins, repo: Repo, name: str) -> str | None:
    """Why `repo` could not be granted `name` now (another repo's exclusive grant: who holds it,
    and the handover), or None; read only for a refusal's advice."""
    try:
        return GrantStore(machine, plugins).in_the_way(repo, name)
    except Exception:  # only the advice depends on it: the refusal stands either way
        return None


class StartChecks:
    """The start checks of one repo's gate, on the containers its daemon has."""

    def __init__(
        self,
        machine: Machine,
        repo: Repo,
        plugins: Plugins,
        facts: LiveFacts,
        allowances: AllowanceReader,
        health: HealthReader,
        recorded_health: HealthReader,
        containers: ContainerLookup | None,
        in_the_way: Callable[[str], str | None],
    ) -> None:
        self.machine = machine
        self.repo = repo
        self.plugins = plugins
        self.facts = facts
        self.allowances = allowances
        self.health = health  # brought up to date from the plugins first (a start waits for it)
        self.recorded_health = recorded_health  # the records only, re-read when changed (a create)
        # None only where no daemon is behind the decider (unit tests): the runtime guard still holds.
        self.containers = containers
        self.in_the_way = in_the_way  # the decider's, so that what it is told reaches every refusal

    def stale_facts(self, cdi: tuple[str, ...]) -> list[Refusal]:
        """Names to be injected are not decided on facts older than the specs they would be served
        from: a request naming them, or a start of a container holding them (the spec rewritten at
        boot may make a name reach other hardware than its grant was checked on), is refused until
        the inventory is refreshed (the safe choice; the gate never runs discovery)."""
        why = self.facts.spec_age()
        if why is None:
            return []
        return [
            Refusal(
                message=f"{', '.join(cdi)} cannot be decided now: {why}",
                replacement=f"ask the machine's operator to run `rdc machine refresh {self.machine.name}`, "
                "then try again",
                rule="stale-facts",
            )
        ]

    def held_check(self, where: str, target: Target, route: Route) -> Refuse | None:
        """The refusal of a request that would run a container holding CDI names the repo lacks now,
        or publishing host ports that today's policy or another repo's keeper leaves it no room for."""
        if self.containers is None:
            return None
        ref = path_id(route, target.path)
        try:
            if route.held_in == "exec":
                container = self.containers.exec_container(ref)
                held = None if container is None else self.containers.lookup(container)
            else:
                held = self.containers.lookup(ref)
        except LookupFailed as exc:
            message = f"the gate could not check which devices container {ref} holds: {exc}; try again"
            log = (f"503 {where}: {message}",)
            return Refuse(503, message, log=log, endpoint=route.name, rules=("gate",))
        if held is None:
            return None  # no such container: the daemon says so
        refusals = self._port_problems(held) if route.binds_ports else []
        if held.cdi:
            refusals += self.stale_facts(held.cdi)
        grants, error = self.facts.read_grants() if held.cdi else (frozenset(), None)
        missing = [name for name in held.cdi if error is not None or name not in grants]
        refusals += self._health_problems(held.name, [name for name in held.cdi if name not in missing])
        if not missing and not refusals:
            return None
        why = f" (its grants cannot be read: {error})" if error is not None else ""
        refusals += [
            self._suspended_start(held.name, name)
            or self._ended_start(held.name, name)
            or Refusal(
                message=(
                    f"container {held.name} holds {name}, which repo {self.repo.label} has no grant for "
                    f"now{why}, so it may not run"
                ),
                replacement=self._held_instead(held.name, name),
                rule="grant",
            )
            for name in missing
        ]
        decision = refuse(where, refusals, endpoint=route.name, cdi=held.cdi)
        if route.starts and held.auto_remove and not held.running:
            return self._removed(decision, held)
        return decision

    def _removed(self, decision: Refuse, held: Container) -> Refuse:
        """A refused start of a `--rm` container removes it, as the daemon does when its own start
        fails: `docker run --rm` waits for the removal, and would wait forever for one never made."""
        why = self.containers.remove(held.id) if isinstance(self.containers, ContainerRemover) else "-"
        if why == "-":
            return decision
        line = (
            f"container {held.name} was made with --rm, so the gate removed it"
            if why is None
            else f"container {held.name} was made with --rm, but the gate could not remove it: {why}"
        )
        return dataclasses.replace(decision, message=f"{decision.message}\n{line}", log=(*decision.log, line))

    def _held_instead(self, container: str, name: str) -> str:
        """What a container holding `name` without a grant can do: ask for the grant, or, when
        another repo's exclusive grant is in the way (a fork's copy of a GPU container), hand it over."""
        remove = f"`docker rm {container}` and create it again without the device"
        blocked = self.in_the_way(name)
        if blocked is not None:
            return f"{remove}; {name} cannot be granted to repo {self.repo.label} now: {blocked}"
        return f"an operator's `rdc repo gpu grant {self.repo.ref} --device {name}`, or {remove}"

    def health_at_create(
        self, names: list[str], settings: Mapping[str, str], inventory: Inventory | None
    ) -> list[Refusal]:
        """A create naming a GPU held back for its health is refused then, not at its start: a
        `docker run --rm` whose start is refused would leave a container made for nothing. The
        records as they are (the gate's rounds and each start bring them up to date): a create
        reads no kernel log. `settings` and `inventory`: the decision's own reads of them."""
        return self._health_problems(None, names, self.recorded_health, (settings, inventory))

    def _health_problems(
        self,
        container: str | None,
        names: list[str],
        health: HealthReader | None = None,
        facts: tuple[Mapping[str, str], Inventory | None] | None = None,
    ) -> list[Refusal]:
        """Refusals for the names that reach a GPU held back for its health (setting `gpu-health`);
        `container` None: of a create, before any container is. `facts`: the settings and
        inventory the caller's decision read (None: read them now)."""
        if not names:
            return []
        settings, found = facts if facts is not None else (self.facts.read_settings(), None)
        if not refuses_unhealthy(settings):
            return []
        inventory = (found if facts is not None else self.facts.inventory()) or Inventory()
        try:
            cards = (health or self.health)()
        except RdcError as exc:  # records that cannot be read must not let a faulty card through
            return [
                Refusal(
                    message=f"{'a container' if container is None else f'container {container}'} may not "
                    f"start: the GPU health records cannot be read ({exc.what})",
                    replacement=exc.todo or "fix the file, then start it again",
                    rule="gpu-health",
                )
            ]
        if not cards:
            return []
        return health_refusals(
            container,
            names,
            cards,
            inventory,
            lambda name: self.plugins.hardware_units(name, inventory) or (),
            self.repo.machine,  # as the repo's references name it (`alpha@m1`)
        )

    def suspension(self, name: str) -> tuple[str, str] | None:
        """Why the repo's grant of `name` reaches nothing (setup suspended it, or the hardware it
        recorded is not what its name reaches in the inventory) and what resolves it; None when
        it is neither."""
        try:
            grant = suspended_grant(self.machine, self.repo.id, name)
            moved = None if grant is not None else self.facts.moved(name)
        except Exception:  # only the words depend on it: the refusal stands either way
            return None
        if moved is not None:
            held, how = moved
            why = (
                f"the grant of {name} to repo {self.repo.ref} no longer reaches the hardware it was "
                f"given on: {how}"
            )
            return why, suspension_advice(held, self.repo.ref)
        if grant is None:
            return None
        return suspension_text(grant, self.repo.ref), suspension_advice(grant, self.repo.ref)

    def _suspended_start(self, container: str, name: str) -> Refusal | None:
        found = self.suspension(name)
        if found is None:
            return None
        why, advice = found
        return Refusal(
            message=f"container {container} holds {name} and may not run: {why}",
            replacement=f"an operator's {advice}",
            rule="grant",
        )

    def _ended_start(self, container: str, name: str) -> Refusal | None:
        """The refusal of a start whose lease of `name` has ended: said as such, with when."""
        try:
            lease = ended_lease(self.machine, self.repo.id, name)
        except Exception:  # only the words depend on it: the refusal stands either way
            return None
        if lease is None:
            return None
        return Refusal(
            message=(
                f"container {container} holds {name}, whose lease to repo {self.repo.label} ended at "
                f"{lease.expires_at}, so it may not run"
            ),
            replacement=(
                f"an operator's `rdc repo gpu grant {self.repo.ref} --device {name} --for 8h` (an ended "
                f"lease is granted anew), or `docker rm {container}` and create it again without the device"
            ),
            rule="grant",
        )

    def _port_problems(self, held: Container) -> list[Refusal]:
        """The publishing rules for a container about to run, under today's settings and keepers."""
        if not held.ports:
            return []
        policy = self.allowances.current(self.facts.read_settings()).publishing
        findings = publish.check(
            list(held.ports), self.allowances.published(policy), self.repo.machine, counted=not held.running
        )
        return [
            dataclasses.replace(f.refusal, message=f"container {held.name}: {f.refusal.message}")
            for f in findings
        ]
