"""The reconciler: grants tagged with a Slurm job that Slurm no longer runs are revoked.

An epilog does not run when slurmd or the node dies; the job's end (`--until`) is the backstop, and
this is the prompt one: it compares the machine's job-tagged grants with the jobs the controller
still holds live, and revokes (with `--stop`) the rest, each in the repo's audit log.
"""

from __future__ import annotations

from rediacc_core.grants.records import Grant, read_grants
from rediacc_core.machine import Machine
from rediacc_core.slurm import client
from rediacc_core.slurm.hooks import release


def orphans(machine: Machine) -> list[Grant]:
    """The machine's grants whose Slurm job (of this machine's cluster) is not live now."""
    tagged = [g for g in read_grants(machine) if g.job is not None and g.job.startswith("slurm:")]
    if not tagged:
        return []
    cluster = client.cluster_name(machine)
    live = {j.job_id for j in client.jobs(machine) if j.live}
    found = []
    for grant in tagged:
        assert grant.job is not None
        name, _, job_id = grant.job.removeprefix("slurm:").partition("/")
        if name == cluster and job_id not in live:
            found.append(grant)
    return found


def reconcile(machine: Machine) -> list[Grant]:
    found = orphans(machine)
    by_job: dict[str, list[Grant]] = {}
    for grant in found:
        by_job.setdefault(grant.job or "", []).append(grant)
    for job, grants in by_job.items():
        release(machine, grants, f"{job} no longer runs in Slurm (reconciler)")
    return found
