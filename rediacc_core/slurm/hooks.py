"""The prolog and the epilog: what a Slurm allocation means on the machine, and its end.

The prolog (root, under slurmd, with the job's environment) turns the GPUs Slurm allocated
(`SLURM_JOB_GPUS`, indexes read through the gres map, never a vendor's visible-devices variable)
into an exclusive grant to the job's repo, tagged `slurm:<cluster>/<job id>`, until the job's end (the
backstop when every hook fails). The job names its repo in its comment (`rdc-repo=NAME`); that is a
request, which the repo's Slurm access list must admit for the job's user or account.

A refusal is policy, not a fault: the job is cancelled with the reason in its AdminComment (the
cancel itself just after the prolog has ended) and the hook exits 0, since a failing prolog drains
the whole node. Only a node that cannot honour any lease
(a stale gres map, an index the map does not know) is drained, with rdc's reason. A real fault
(Slurm or the grants file unreadable) raises, and the CLI exits non-zero.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rediacc_core.errors import RdcError, RefusedError, ValidationError
from rediacc_core.grants.records import Grant, read_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.slurm import client
from rediacc_core.slurm.access import access_for
from rediacc_core.slurm.gres import read_map, stale_reason

REPO_KEY = "rdc-repo="


@dataclass(frozen=True)
class Outcome:
    """What a hook did: `granted` or `revoked` names, or the refusal it made (`refused`)."""

    job: str
    repo: str = ""
    granted: tuple[str, ...] = ()
    revoked: tuple[str, ...] = ()
    refused: str = ""
    drained: bool = False
    note: str = ""

    def line(self) -> str:
        if self.refused:
            return f"rdc: job {self.job} refused: {self.refused}"
        if self.granted:
            return f"rdc: job {self.job}: granted {', '.join(self.granted)} to {self.repo}"
        if self.revoked:
            return f"rdc: job {self.job}: revoked {', '.join(self.revoked)} from {self.repo}"
        return f"rdc: job {self.job}: {self.note or 'nothing to do'}"


def job_tag(cluster: str, job_id: str) -> str:
    return f"slurm:{cluster}/{job_id}"


def repo_named(comment: str) -> str | None:
    """The repo a job's comment names (`rdc-repo=NAME`, among other words), or None."""
    for word in comment.replace(",", " ").split():
        if word.startswith(REPO_KEY):
            return word[len(REPO_KEY) :] or None
    return None


def _indexes(text: str) -> list[int]:
    """SLURM_JOB_GPUS: `0,1` or ranges `0-2`."""
    found: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return found


class Prolog:
    """One prolog run: `run()` decides and acts; it raises only on a real fault."""

    def __init__(self, machine: Machine, env: Mapping[str, str], slurm: Machine | None = None) -> None:
        self.machine = machine
        self.slurm = slurm or machine  # whose Slurm tools reach the controller (the node's own, here)
        self.env = env
        self.job_id = env.get("SLURM_JOB_ID", "")
        self.tag = job_tag(env.get("SLURM_CLUSTER_NAME", ""), self.job_id)
        self.node = env.get("SLURMD_NODENAME", machine.name)

    def refuse(self, why: str, *, drain: bool = False) -> Outcome:
        reason = f"rdc: {why}"
        if drain:
            client.drain(self.slurm, self.node, reason)
        self.cancel(reason)
        return Outcome(self.tag, refused=why, drained=drain)

    def cancel(self, reason: str) -> None:
        """Cancel the job with `reason`, once this prolog has ended (see `client.cancel_after`)."""
        client.cancel_after(self.slurm, self.job_id, reason, os.getpid())

    def job_end(self) -> str | None:
        """The job's end as Slurm has it now (the prolog asks the controller)."""
        job = client.job(self.slurm, self.job_id)
        return job.end_iso if job is not None else None

    def run(self) -> Outcome:
        if not self.job_id or not self.env.get("SLURM_CLUSTER_NAME"):
            raise RdcError("SLURM_JOB_ID or SLURM_CLUSTER_NAME is not set", "run it as slurmd's Prolog")
        wanted = repo_named(self.env.get("SLURM_JOB_COMMENT", ""))
        gpus = self.env.get("SLURM_JOB_GPUS", "")
        if wanted is None:
            return Outcome(self.tag, note="not an rdc lease (no rdc-repo= in its comment)")
        repo = RepoStore(self.machine).find(wanted)
        if repo is None:
            return self.refuse(f"no repo {wanted} on machine {self.machine.name}")
        user, account = self.env.get("SLURM_JOB_USER"), self.env.get("SLURM_JOB_ACCOUNT")
        allowed = access_for(self.machine, repo.id)
        if not allowed.admits(user, account):
            return self.refuse(
                f"user {user} (account {account}) may not lease for repo {repo.ref}; allowed: "
                f"{allowed.describe()} (rdc repo slurm allow {repo.ref} --user {user})"
            )
        if not gpus:
            return self.refuse(f"the job holds no GPU of node {self.node} to lease for {repo.ref}")
        found = read_map(self.machine)
        stale = stale_reason(self.machine, found)
        if stale is not None or found is None:
            return self.refuse(f"gres map of {self.node} is stale: {stale}", drain=True)
        names, cards = [], set()
        for index in _indexes(gpus):
            entry = found.by_index(index)
            if entry is None:
                return self.refuse(f"GPU index {index} is not in the gres map of {self.node}", drain=True)
            names.append(entry.cdi)
            cards.add((entry.pci_bus_id or "").lower())
        from rediacc_core.slurm.drains import held_reason

        held = held_reason(self.machine, found, cards)
        if held is not None:
            return self.refuse(held.removeprefix("rdc: "), drain=True)
        return self._grant(repo, names)

    def _grant(self, repo: Repo, names: list[str]) -> Outcome:
        from rediacc_core.grants.store import GrantStore
        from rediacc_core.plugins import get_plugins
        from rediacc_core.runtime.holdings import Holdings

        end = self.job_end()
        if end is None:
            return self.refuse(
                f"Slurm gives job {self.job_id} no end time; rdc leases only until a job's end"
            )
        try:
            GrantStore(self.machine, get_plugins(), running=Holdings(self.machine)).grant(
                repo, names, True, expires_at=end, job=self.tag
            )
        except (RefusedError, ValidationError) as exc:
            return self.refuse(exc.what)
        audit(self.machine, repo, "slurm-lease", names, f"{self.tag} granted until {end}")
        return Outcome(self.tag, repo.ref, granted=tuple(names))


def job_grants(machine: Machine, tag: str) -> list[Grant]:
    return [g for g in read_grants(machine) if g.job == tag]


def release(machine: Machine, grants: Iterable[Grant], why: str) -> list[tuple[Repo, list[str]]]:
    """Revoke `grants` and empty their repos (revoke --stop, `grants.release`: the one place hardware
    leaves a repo, so a descriptor in flight goes too); audited per repo. A repo that cannot be
    emptied keeps its revocation (its residue waits for the next exclusive grant) and is said."""
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.plugins import get_plugins
    from rediacc_core.runtime.holdings import Holdings

    by_repo: dict[str, list[str]] = {}
    for grant in grants:
        by_repo.setdefault(grant.repo_id, []).append(grant.device)
    store = GrantStore(machine, get_plugins(), running=Holdings(machine))
    repos = {r.id: r for r in RepoStore(machine).list()}
    done: list[tuple[Repo, list[str]]] = []
    for repo_id, names in by_repo.items():
        repo = repos.get(repo_id)
        if repo is None:
            continue  # its grants went with it (`rdc machine gpu prune` for leftovers)
        try:
            store.revoke_emptying(repo, names)
        except RdcError as exc:  # the revocation stands; what still runs is named
            store.revoke(repo, names, absent_ok=True)
            audit(machine, repo, "slurm-release", names, f"{why}; not emptied: {exc.what}")
        else:
            audit(machine, repo, "slurm-release", names, why)
        done.append((repo, names))
    return done


def epilog(machine: Machine, env: Mapping[str, str]) -> Outcome:
    """Revoke (and stop) what the job was granted on this machine."""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id or not env.get("SLURM_CLUSTER_NAME"):
        raise RdcError("SLURM_JOB_ID or SLURM_CLUSTER_NAME is not set", "run it as slurmd's Epilog")
    tag = job_tag(env["SLURM_CLUSTER_NAME"], job_id)
    held = job_grants(machine, tag)
    done = release(machine, held, f"{tag} ended (epilog)")
    if not done:
        return Outcome(tag, note="no grant of this job on the machine")
    return Outcome(tag, ", ".join(r.ref for r, _ in done), revoked=tuple(n for _, ns in done for n in ns))


def audit(machine: Machine, repo: Repo, endpoint: str, names: Iterable[str], message: str) -> None:
    """One line in the repo's audit log (best effort: the grant or revoke stands without it)."""
    from rediacc_core.gate.audit.log import append_event
    from rediacc_core.runtime.layout import runtime_for

    with contextlib.suppress(OSError):
        append_event(
            runtime_for(machine, repo).audit_log,
            {"id": repo.id, "name": repo.name},
            endpoint=endpoint,
            decision=endpoint.removeprefix("slurm-"),
            cdi=list(names),
            message=message,
        )
