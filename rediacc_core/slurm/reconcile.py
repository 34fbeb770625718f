"""The reconciler: the machine's grants tagged with a Slurm job are held to the jobs Slurm runs.

An epilog does not run when slurmd or the node dies; the job's end (`--until`) is the backstop, and
this is the prompt one: a grant whose job is no longer live is revoked (with `--stop`), in the repo's
audit log. A live job whose end moved (`scontrol update JobId=… TimeLimit=…`) has its grants renewed
to the new end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rediacc_core.errors import RdcError
from rediacc_core.grants.records import Grant, read_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.slurm import client
from rediacc_core.slurm.hooks import audit, release


@dataclass
class Reconciled:
    revoked: list[Grant] = field(default_factory=list)
    renewed: list[tuple[Grant, str]] = field(default_factory=list)  # (grant, its new end)


def reconcile(machine: Machine, seen: tuple[str, list[client.Job]] | None = None) -> Reconciled:
    """Hold `machine`'s grants to Slurm's jobs: its own tools ask the controller, unless `seen` gives
    what the caller read (the cluster's name and its jobs; the bridge reads them once for every box)."""
    done = Reconciled()
    tagged = [g for g in read_grants(machine) if g.job is not None and g.job.startswith("slurm:")]
    if not tagged:
        return done
    cluster, jobs = seen if seen is not None else (client.cluster_name(machine), client.jobs(machine))
    live = {j.job_id: j for j in jobs if j.live}
    gone: dict[str, list[Grant]] = {}
    moved: dict[tuple[str, str], list[Grant]] = {}
    for grant in tagged:
        assert grant.job is not None
        name, _, job_id = grant.job.removeprefix("slurm:").partition("/")
        if name != cluster:
            continue
        job = live.get(job_id)
        if job is None:
            gone.setdefault(grant.job, []).append(grant)
        elif job.end_iso is not None and job.end_iso != grant.expires_at and job.end > time.time():
            # A job past its end (a limit lowered below its run time, which its user may do) still
            # shows RUNNING until slurmctld looks: its grant lapses at its own end, never renewed back.
            moved.setdefault((grant.repo_id, job.end_iso), []).append(grant)
    for job_tag, grants in gone.items():
        release(machine, grants, f"{job_tag} no longer runs in Slurm (reconciler)")
        done.revoked.extend(grants)
    if moved:
        _renew(machine, moved, done)
    return done


def _renew(machine: Machine, moved: dict[tuple[str, str], list[Grant]], done: Reconciled) -> None:
    from rediacc_core.grants.store import GrantStore
    from rediacc_core.plugins import get_plugins

    store = GrantStore(machine, get_plugins())
    repos = {r.id: r for r in RepoStore(machine).list()}
    for (repo_id, end), grants in moved.items():
        repo = repos.get(repo_id)
        if repo is None:
            continue
        try:
            store.renew(repo, [g.device for g in grants], end)
        except RdcError as exc:  # one repo's renewal failing leaves the others theirs
            audit(machine, repo, "slurm-lease", [g.device for g in grants], f"not renewed: {exc.what}")
            continue
        audit(
            machine, repo, "slurm-lease", [g.device for g in grants], f"{grants[0].job} renewed until {end}"
        )
        done.renewed.extend((g, end) for g in grants)
