"""Asking Slurm for a lease from rdc, and ending one early.

A request is `salloc --no-shell` on the repo's own node (`--nodelist` from the gres map: the repo
lives on that machine), always with memory and CPUs of its own so the lease never holds the node's
other GPUs, and the repo named in its comment for the prolog. salloc runs detached, its output in
`/run/rediacc/slurm/`, so a pending lease does not hold the terminal; the prolog makes the grant
when the job starts. A release cancels the repo's jobs and revokes their grants with `--stop`.

In external mode (Slurm 25.05 or later, the box a `State=EXTERNAL` node with no Slurm of its own)
the lease is an external job, `sbatch --external` (no script: Slurm only allocates), submitted with
the Slurm tools of another machine (the operator's host, where `rdc slurm bridge` runs); the bridge
makes the grant when the job runs. sbatch returns at once with the job's id.
"""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from rediacc_core.errors import StateError, ToolError
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.slurm import client
from rediacc_core.slurm.gres import read_map
from rediacc_core.slurm.hooks import REPO_KEY, release


@dataclass(frozen=True)
class LeaseRequest:
    gres: str
    duration: timedelta
    mem: str = "8G"
    cpus: int = 1
    account: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    external: bool = False


def salloc_argv(repo: Repo, node: str, ask: LeaseRequest) -> list[str]:
    """The lease's command line: `salloc --no-shell …`, or `sbatch --external …` in external mode."""
    minutes = max(1, math.ceil(ask.duration.total_seconds() / 60))
    return [
        *(["sbatch", "--external", "--parsable"] if ask.external else ["salloc", "--no-shell"]),
        f"--gres={ask.gres}",
        f"--time={minutes}",
        f"--mem={ask.mem}",
        f"--cpus-per-task={ask.cpus}",
        f"--nodelist={node}",
        f"--comment={REPO_KEY}{repo.label}",
        f"--job-name=rdc-{repo.label}",
        *([f"--account={ask.account}"] if ask.account else []),
        *([f"--constraint={ask.constraint}"] if ask.constraint else []),
        *([f"--reservation={ask.reservation}"] if ask.reservation else []),
    ]


def submit(
    machine: Machine, repo: Repo, ask: LeaseRequest, wait: float = 15.0, slurm: Machine | None = None
) -> client.Job:
    """Submit the lease; the job as squeue shows it once Slurm gave it an id. `slurm`: the machine
    whose Slurm tools submit and read it (the repo's own machine when None)."""
    found = read_map(machine)
    if found is None:
        raise StateError(
            f"machine {machine.name} is no Slurm node of rdc's yet (no gres map)",
            f"rdc slurm gres {machine.name}",
        )
    if ask.external:
        return _submit_external(slurm or machine, salloc_argv(repo, found.node, ask))
    salloc = machine.which("salloc")
    if salloc is None:
        raise ToolError(f"machine {machine.name} has no salloc", "apt-get install -y slurm-client")
    logs = machine.path("/run/rediacc/slurm")
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"salloc-{repo.id}-{time.time_ns()}.log"
    argv = salloc_argv(repo, found.node, ask)
    with open(log, "wb") as out:
        subprocess.Popen(
            [salloc, *argv[1:]], stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    job_id = _job_id(log, wait)
    job = client.job(machine, job_id)
    if job is None:
        raise ToolError(f"Slurm gave job {job_id} but squeue does not show it", f"sacct -j {job_id}")
    return job


def _submit_external(slurm: Machine, argv: list[str]) -> client.Job:
    job_id = client.run(slurm, argv).strip().split(";", 1)[0]  # --parsable: `ID` or `ID;CLUSTER`
    job = client.job(slurm, job_id)
    if job is None:
        raise ToolError(f"Slurm gave job {job_id} but squeue does not show it", f"sacct -j {job_id}")
    return job


def _job_id(log: Path, wait: float) -> str:
    end = time.monotonic() + wait
    text = ""
    while time.monotonic() < end:
        text = log.read_text(errors="replace")
        for line in text.splitlines():
            if "job allocation" in line:
                return line.rstrip().rsplit(" ", 1)[-1]
            if "error" in line.lower():
                raise ToolError(
                    f"salloc refused the lease: {line.strip()}", "check --gres, --account and the time"
                )
        time.sleep(0.1)
    raise ToolError(f"salloc gave no job id in {wait:.0f}s: {text.strip() or 'no output'}", f"read {log}")


def is_lease_of(job: client.Job, repo: Repo) -> bool:
    """Whether Slurm holds `job` (pending or live) as a lease of `repo`, by the comment rdc writes."""
    wanted = f"{REPO_KEY}{repo.label}"
    return wanted in job.comment.replace(",", " ").split() and (job.live or job.state == "PENDING")


def leases(machine: Machine, repo: Repo, slurm: Machine | None = None) -> list[client.Job]:
    """The repo's jobs Slurm holds now (pending or live). With `slurm` (external mode: the machine
    whose tools reach Slurm), those asked for or placed on the repo's own node only, since a repo of
    the same name on another box names the same repo in its comment."""
    if slurm is None:
        return [j for j in client.jobs(machine) if is_lease_of(j, repo)]
    found = read_map(machine)
    node = found.node if found is not None else machine.name
    return [j for j in client.jobs(slurm) if is_lease_of(j, repo) and node in (j.nodes, j.required_nodes)]


def leases_of(machine: Machine, repos: list[Repo]) -> dict[str, list[client.Job]]:
    """Each repo's jobs Slurm holds now, by repo id, from one `squeue`."""
    found = client.jobs(machine)
    return {r.id: [j for j in found if is_lease_of(j, r)] for r in repos}


def end(machine: Machine, repo: Repo, job_id: str | None = None, slurm: Machine | None = None) -> list[str]:
    """Cancel the repo's leases (one, with `job_id`) and revoke their grants with --stop; returns
    the names revoked. `slurm`: as for `leases` (external mode)."""
    jobs = [j for j in leases(machine, repo, slurm) if job_id is None or j.job_id == job_id]
    if job_id is not None and not jobs:
        raise StateError(
            f"job {job_id} is no lease of {repo.ref} that Slurm holds", f"rdc repo gpu leases {repo.ref}"
        )
    for job in jobs:
        client.run(slurm or machine, ["scancel", job.job_id])
    ids = {j.job_id for j in jobs}
    held = [
        g for g in read_grants(machine) if g.repo_id == repo.id and g.job and g.job.rsplit("/", 1)[-1] in ids
    ]
    release(machine, held, "released early (rdc repo gpu release)")
    return [g.device for g in held]
