"""The refusals of CDI names a repo may not have now, in words that lead somewhere: the grant to ask
for, the handover when another repo holds it, the device meant by a typo, a refresh for stale facts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rediacc_core.cdi.registry import Registry, suggest
from rediacc_core.gate.decide.live_facts import LiveFacts
from rediacc_core.gate.decide.start_checks import StartChecks
from rediacc_core.grants.records import ended_lease
from rediacc_core.model import Refusal

if TYPE_CHECKING:
    from rediacc_core.machine import Machine
    from rediacc_core.repos import Repo


class GrantRefusals:
    """Why the names of one repo's request are refused, if they are."""

    def __init__(self, machine: Machine, repo: Repo, facts: LiveFacts, checks: StartChecks) -> None:
        self.machine = machine
        self.repo = repo
        self.facts = facts
        self.checks = checks  # the suspensions and the other repos' exclusive grants, for the advice

    def grant_problems(
        self, names: tuple[str, ...], grants: frozenset[str], error: str | None
    ) -> list[Refusal]:
        if not names:
            return []
        if error is not None:
            message = (
                f"device requests are refused because the grants of repo {self.repo.label} "
                f"cannot be read ({error})"
            )
            return [Refusal(message=message, rule="grant")]
        missing = [name for name in names if name not in grants]
        return [Refusal(message=self._no_grant(name, grants), rule="grant") for name in missing]

    def _no_grant(self, name: str, held: frozenset[str] = frozenset()) -> str:
        """Why `name` is refused, and advice that leads somewhere: a grant of a device the machine
        has, or the names it does have when `name` is none of them (a grant of a typo is refused)."""
        where = self.machine.name
        try:
            defined = Registry.for_machine(self.machine).names()
        except Exception:  # only the advice depends on it: the refusal stands either way
            defined = None
        suspended = self.checks.suspension(name)
        if suspended is not None:
            return f"{suspended[0]}; it reaches nothing until an operator resolves it ({suspended[1]})"
        if defined is None or name in defined:
            grant = f"rdc repo gpu grant {self.repo.ref} --device {name}"
            try:
                lease = ended_lease(self.machine, self.repo.id, name)
            except Exception:  # only the advice depends on it
                lease = None
            blocked = self.checks.in_the_way(name)
            if blocked is not None:  # a grant would be refused: say who holds it, and the handover
                return f"repo {self.repo.label} has no grant for {name}, and cannot have one now: {blocked}"
            if lease is not None:  # an ended lease cannot be renewed: it is granted anew
                ended = lease.expires_at
                return f"the lease of {name} to repo {self.repo.label} ended at {ended} ({grant} --for 8h)"
            return f"repo {self.repo.label} has no grant for {name} ({grant})"
        close = suggest(name, defined)
        if not close:
            return f"{name} is not a device on machine {where} (its devices: rdc machine gpu list {where})"
        mine = [c for c in close if c in held]
        if mine:  # the repo holds the name meant already: no grant to ask for
            return (
                f"{name} is not a device on machine {where}; did you mean {' or '.join(close)}? "
                f"(repo {self.repo.label} holds {mine[0]} already: --device {mine[0]})"
            )
        return (
            f"{name} is not a device on machine {where}; did you mean {' or '.join(close)}? "
            f"(rdc repo gpu grant {self.repo.ref} --device {close[0]}; "
            f"every device: rdc machine gpu list {where})"
        )

    def stale_facts(self, cdi: tuple[str, ...]) -> list[Refusal]:
        """A device request is not decided on facts older than the specs (`StartChecks.stale_facts`)."""
        return self.checks.stale_facts(cdi)
