"""`GrantStore`: grant, renew and revoke a repo's grants, each all or none, under the state lock.

A facade over the checks (`checks`) and, for an exclusive grant, the handover from other repos'
running parts (`handover`); what it writes is the grants file (`records`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rediacc_core.errors import NotFoundError, ValidationError
from rediacc_core.grants import release
from rediacc_core.grants.checks import NAME_ONE, GrantChecks, nearest, owner_ref
from rediacc_core.grants.handover import Handover, RunningParts
from rediacc_core.grants.records import Grant, ended_lease, read_grants, suspension_advice, write_grants
from rediacc_core.grants.units import HardwareUnits
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore, now_iso
from rediacc_core.statelock import state_lock

if TYPE_CHECKING:
    from rediacc_core.holders import Holder
    from rediacc_core.plugins import Plugins


@dataclass(frozen=True)
class GrantOutcome:
    """What `GrantStore.grant` did for one device. `changed` is False when it was already in force."""

    grant: Grant
    changed: bool
    note: str = ""
    stopped: tuple[Holder, ...] = ()  # containers of other repos stopped to make way (--stop-holders)
    taken: tuple[tuple[str, str], ...] = ()  # (repo ref, device) of the grants --take-over revoked


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
        self.checks = GrantChecks(machine, self.plugins)
        self.handover = Handover(machine, self.plugins, running)

    @property
    def running(self) -> RunningParts:
        return self.handover.running

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
        listed: Collection[tuple[str, str]] | None = None,
        job: str | None = None,
    ) -> list[GrantOutcome]:
        """Grant every name in `devices` to `repo`, or none of them.

        ValidationError (exit 2) for a malformed or undefined name, RefusedError (exit 4) when an
        exclusive grant is in the way, or when an exclusive grant would reserve hardware that
        another repo holds or may hold: a running container with it, a process with one of its
        nodes open, or residue (its grant ended while it runs anything). With `stop_holders` those
        repos are emptied first (`grants.release`: every container of them stopped, under the same
        lock). BusyError (exit 15) when the lock cannot be had.
        With `take_over` (a handover in one step) the other repos' grants in the way are revoked
        and those repos emptied, in that order, under the same lock, instead of refusing; with
        `listed` ((repo id, device) pairs the user was shown), a grant in the way it does not
        list refuses the grant: a take-over never revokes what it did not name. `job` tags the new
        grants with the scheduler's job they serve.
        """
        wanted = _unique(devices)
        with state_lock(self.machine, self.lock_timeout):
            owners = self.checks.owners(repo)
            self.checks.names(wanted)
            current = read_grants(self.machine)
            conflicts = self.checks.conflicts(repo, wanted, exclusive, current, owners)
            if conflicts and not take_over:
                raise self.checks.refusal(repo, wanted, exclusive, conflicts, owners)
            taken = list(dict.fromkeys(other for other, _ in conflicts))
            unlisted = [g for g in taken if listed is not None and (g.repo_id, g.device) not in listed]
            if unlisted:
                raise self.checks.unlisted(repo, wanted, unlisted, owners)
            empty: list[Repo] = []
            idle: set[str] = set()
            if exclusive:
                rest = [g for g in current if g not in taken]
                empty, idle = self.handover.must_empty(repo, wanted, owners, rest, stop_holders or take_over)
                empty += [owners[g.repo_id] for g in taken if g.repo_id in owners]
                empty = list({r.id: r for r in empty}.values())
            outcomes: list[GrantOutcome] = []

            def apply(now_current: list[Grant]) -> list[Grant]:
                result, made = self._apply(repo, wanted, exclusive, now_current, expires_at, job)
                outcomes.extend(made)
                return result

            stopped: tuple[Holder, ...] = ()
            if empty:
                what = ", ".join(wanted)
                why = f"{what} is being handed over to repo {repo.ref}"

                def check() -> None:
                    self.handover.nothing_left(repo, wanted, empty, read_grants(self.machine))

                stopped = release.empty_repos(
                    self.machine, self.running, empty, revoke=taken, why=why, then=apply, check=check
                ).stopped
            else:
                result = apply([g for g in current if g not in taken])
                if taken or idle or any(outcome.changed for outcome in outcomes):
                    write_grants(self.machine, result, emptied=idle)
        refs = tuple((owner_ref(owners, g.repo_id), g.device) for g in taken)
        outcomes = [dataclasses.replace(o, taken=refs, stopped=stopped) for o in outcomes]
        handed = {h.repo.id: h.repo for h in stopped}
        handed.update({r.id: r for r in empty})
        for old in handed.values():
            with contextlib.suppress(OSError):  # the grant stands; its audit line is best effort
                self.running.record_handover(old, repo, wanted, stopped)
        return outcomes

    def _apply(
        self,
        repo: Repo,
        wanted: Sequence[str],
        exclusive: bool,
        current: list[Grant],
        expires_at: str | None,
        job: str | None = None,
    ) -> tuple[list[Grant], list[GrantOutcome]]:
        """The grants after granting `wanted` to `repo` over `current`, and what changed for each."""
        outcomes: list[GrantOutcome] = []
        result = list(current)
        stamp = now_iso()
        units = HardwareUnits(self.machine, self.plugins)
        for device in wanted:
            held = next((g for g in current if g.repo_id == repo.id and g.device == device), None)
            if held is None:
                new = Grant(repo.id, device, exclusive, stamp, expires_at, units.binding(device), job=job)
                result.append(new)
                outcomes.append(GrantOutcome(new, True))
            elif exclusive and not held.exclusive:
                new = dataclasses.replace(held, exclusive=True, granted_at=stamp)
                result[result.index(held)] = new
                outcomes.append(GrantOutcome(new, True, "was shared, now exclusive"))
            elif held.exclusive and not exclusive:
                # Never loosen a reservation as a side effect of a plain grant.
                note = "already granted exclusively; revoke and grant again to share"
                outcomes.append(GrantOutcome(held, False, note))
            else:
                outcomes.append(GrantOutcome(held, False, _granted_again(repo, held, expires_at)))
        return result, outcomes

    def take_over_plan(self, repo: Repo, devices: Sequence[str]) -> list[tuple[str, Grant]]:
        """What `grant(..., exclusive=True, take_over=True)` would revoke now: every other repo's
        grant in the way, with its repo's reference. Read without the lock: the grant checks again."""
        owners = {r.id: r for r in RepoStore(self.machine).list()}
        conflicts = self.checks.conflicts(repo, _unique(devices), True, self.all(), owners)
        return [(owner_ref(owners, g.repo_id), g) for g in dict.fromkeys(g for g, _ in conflicts)]

    def in_the_way(self, repo: Repo, device: str) -> str | None:
        """Why `repo` could not be granted `device` now, or None when it could: the other repos'
        exclusive grants in the way, who holds them and the handover that moves them. Read without
        the state lock: it is advice for a refusal, and `grant` checks again under the lock."""
        owners = {r.id: r for r in RepoStore(self.machine).list()}
        current = self.all()
        conflicts = self.checks.conflicts(repo, [device], False, current, owners)
        if not conflicts:
            return None
        # The handover advised is an exclusive grant: it takes every grant in the way of that too
        # (a third repo's shared grant of the same hardware), and names each one.
        every = self.checks.conflicts(repo, [device], True, current, owners)
        handover = self.checks.refusal(repo, [device], True, every, owners).todo
        return "; ".join(why for _, why in conflicts) + f" ({handover})"

    def running_holders(
        self, repo: Repo, devices: Sequence[str], owners: Mapping[str, Repo] | None = None
    ) -> list[tuple[Holder, str]]:
        """The running containers of repos other than `repo` that hold hardware `devices` reach."""
        return self.handover.running_holders(repo, devices, owners)

    # --- renew ---------------------------------------------------------------------------------
    def renew(self, repo: Repo, devices: Sequence[str], expires_at: str | None) -> list[Grant]:
        """Move the end of the repo's grants of `devices` to `expires_at` (None: make them permanent),
        all or none; NotFoundError when one is not held (a lease already over is not held)."""
        wanted = _unique(devices)
        if not wanted:
            raise ValidationError("no device given", NAME_ONE)
        if expires_at is not None and expires_at <= now_iso():
            raise ValidationError(f"{expires_at} is not in the future", "give a later --until, or --for")
        with state_lock(self.machine, self.lock_timeout):
            current = read_grants(self.machine)
            self._refuse_ended(
                repo, [d for d in wanted if not any(g.repo_id == repo.id and g.device == d for g in current)]
            )
            granted = self._granted(repo, wanted, current, "renewed")
            renewed = {d: dataclasses.replace(g, expires_at=expires_at) for d, g in granted.items()}
            write_grants(
                self.machine, [renewed.get(g.device, g) if g.repo_id == repo.id else g for g in current]
            )
        return [renewed[d] for d in wanted]

    def _refuse_ended(self, repo: Repo, missing: Sequence[str]) -> None:
        """A lease that has ended is not held, so not renewed: say when it ended and grant it anew."""
        for device in missing:
            lease = ended_lease(self.machine, repo.id, device)
            if lease is not None:
                raise NotFoundError(
                    f"the lease of {device} to {repo.ref} ended at {lease.expires_at}; an ended lease is "
                    "not renewed, nothing was renewed",
                    f"grant it anew: rdc repo gpu grant {repo.ref} --device {device} --for 8h",
                )

    def _granted(
        self, repo: Repo, wanted: Sequence[str], current: Sequence[Grant], what: str
    ) -> dict[str, Grant]:
        """The repo's grants of `wanted`; NotFoundError naming what it is not granted."""
        granted = {g.device: g for g in current if g.repo_id == repo.id}
        missing = [device for device in wanted if device not in granted]
        if missing:
            listing = ", ".join(sorted(granted)) if granted else "none"
            raise NotFoundError(
                f"{repo.ref} holds no grant of {', '.join(missing)}{nearest(missing[0], granted)}; "
                f"nothing was {what}",
                f"its grants: {listing} (see `rdc repo gpu list {repo.ref}`)",
            )
        return {device: granted[device] for device in wanted}

    # --- revoke --------------------------------------------------------------------------------
    def revoke(self, repo: Repo, devices: Sequence[str], *, absent_ok: bool = False) -> list[Grant]:
        """Remove the repo's grants of `devices`, all or none; NotFoundError when one is not held
        (with `absent_ok`, only when it is not even a name a CDI spec defines)."""
        with state_lock(self.machine, self.lock_timeout):
            removed = self._revoked(repo, devices, absent_ok)
            write_grants(self.machine, [g for g in read_grants(self.machine) if g not in removed])
        return removed

    def revoke_emptying(self, repo: Repo, devices: Sequence[str]) -> tuple[list[Grant], release.Emptied]:
        """Revoke the repo's grants of `devices` and empty the repo (`grants.release`): the revocation
        is written first, with the drain mark, then every container of the repo is stopped. A name the
        repo no longer holds is no error (the rerun of a revoke without --stop): it is emptied all the
        same. StateError or RefusedError when it cannot be emptied; the revocation stands."""
        with state_lock(self.machine, self.lock_timeout):
            removed = self._revoked(repo, devices, True)
            why = f"{', '.join(_unique(devices))} is being revoked from repo {repo.ref}"
            emptied = release.empty_repos(self.machine, self.running, [repo], revoke=removed, why=why)
        return removed, emptied

    def _revoked(self, repo: Repo, devices: Sequence[str], absent_ok: bool) -> list[Grant]:
        """The repo's grants of `devices` that a revoke removes; the caller holds the state lock."""
        wanted = _unique(devices)
        if not wanted:
            raise ValidationError("no device given", NAME_ONE)
        current = read_grants(self.machine)
        if absent_ok:
            from rediacc_core.cdi.registry import Registry

            defined = Registry.for_machine(self.machine).names()
            mine = {g.device for g in current if g.repo_id == repo.id}
            self._granted(repo, [d for d in wanted if d in mine or d not in defined], current, "revoked")
            wanted = [d for d in wanted if d in mine]
        granted = self._granted(repo, wanted, current, "revoked")
        return [granted[device] for device in wanted]


def _unique(devices: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(devices))


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
