"""External mode: Slurm (25.05 or later) schedules GPU boxes that run no Slurm daemon, and this
bridge makes its allocations true on the boxes.

Each box is a `State=EXTERNAL` node whose name is the `node` of the box's gres map (written by
`rdc slurm gres`), so the map says which machine a node is and which card each of its GPU indexes
is. One round reads `squeue --json` once, through the Slurm tools of one machine (the operator's
host), and for every box:

- revokes (with `--stop`, `hooks.release`) each grant whose job no longer runs, and renews one whose
  job's end moved: the reconciler, given the jobs this round read;
- for each RUNNING job on the box's node whose comment names a repo (`rdc-repo=NAME`) and which holds
  no grant there yet, decides exactly as the prolog does (`hooks.Prolog`: the repo exists, the job's
  user or account is allowed for it, the map is current, no card is held back) and grants the job's
  cards exclusively to the repo, tagged `slurm:<cluster>/<job id>`, until the job's end. A refusal
  writes its reason in the job's AdminComment and cancels the job at once (no prolog holds it here).

Which cards: Slurm 26.05 numbers no device of a node without slurmd (it never reads that node's
gres.conf), so an external job's `gres_detail` is a count per type (`gpu:a100(CNT:1)`), never
`(IDX:…)`. Slurm keeps the count within the node's cards; the bridge picks that many cards of the
type from the box's gres map that no grant holds, lowest index first. Where a Slurm does give
indexes (`gpu:a100:1(IDX:0)`), those are used as they are.

A job that spans several nodes is not granted (an external lease is one box's cards). Boxes are
machines whose files rdc reaches from this host (the local roots); a box over SSH is not bridged yet.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rediacc_core.errors import RdcError
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.slurm import client
from rediacc_core.slurm.gres import read_map
from rediacc_core.slurm.hooks import Outcome, Prolog, job_tag, repo_named
from rediacc_core.slurm.reconcile import reconcile

_IDX = re.compile(r"\(IDX:([0-9,\-]*)\)")
_CNT = re.compile(r"^gpu(?::([^:(]+))?(?::\d+)?\(CNT:(\d+)\)$")


@dataclass(frozen=True)
class Box:
    """One external node and the rdc machine it is."""

    node: str
    machine: Machine


def boxes(machines: Iterable[Machine]) -> list[Box]:
    """The machines that are Slurm nodes of rdc's (a gres map written), with their node names."""
    found = []
    for machine in machines:
        if machine.remote is not None:
            continue
        gres = read_map(machine)
        if gres is not None:
            found.append(Box(gres.node, machine))
    return found


def gpu_indexes(job: client.Job, box: Machine) -> str:
    """The job's GPU indexes as the prolog's SLURM_JOB_GPUS writes them (`0,2`): Slurm's own where its
    gres_detail has them, else cards of the box's map that no grant holds, as many of each type as
    Slurm counted. Fewer free cards than counted: the indexes found (the grant then holds fewer
    cards than Slurm counts, and `Prolog` refuses a job left with none)."""
    given = [m.group(1) for detail in job.gpus for m in _IDX.finditer(detail) if m.group(1)]
    if given:
        return ",".join(given)
    gres = read_map(box)
    if gres is None:
        return ""
    held = {g.device for g in read_grants(box)}
    free = [e for e in gres.entries if e.cdi not in held]
    chosen: list[int] = []
    for detail in job.gpus:
        counted = _CNT.match(detail)
        if counted is None:
            continue
        kind, count = counted.group(1), int(counted.group(2))
        fits = [e.index for e in free if (kind is None or e.type == kind) and e.index not in chosen]
        chosen.extend(fits[:count])
    return ",".join(str(i) for i in sorted(chosen))


class ExternalGrant(Prolog):
    """The prolog's decision for a job on an external node, made by the bridge."""

    def cancel(self, reason: str) -> None:
        client.cancel_now(self.slurm, self.job_id, reason)


def job_env(job: client.Job, cluster: str, box: Box) -> dict[str, str]:
    """The job as the prolog's environment would show it on `box`."""
    return {
        "SLURM_JOB_ID": job.job_id,
        "SLURM_CLUSTER_NAME": cluster,
        "SLURM_JOB_COMMENT": job.comment,
        "SLURM_JOB_GPUS": gpu_indexes(job, box.machine),
        "SLURM_JOB_USER": job.user,
        "SLURM_JOB_ACCOUNT": job.account,
        "SLURMD_NODENAME": box.node,
    }


def bridge_round(slurm: Machine, bridged: Sequence[Box]) -> list[Outcome]:
    """One round over every box; what it granted, revoked and refused."""
    cluster = client.cluster_name(slurm)
    jobs = client.jobs(slurm)
    done: list[Outcome] = []
    for box in bridged:
        settled = reconcile(box.machine, (cluster, jobs))
        refs = {r.id: r.ref for r in RepoStore(box.machine).list()}
        for grant in settled.revoked:
            repo = refs.get(grant.repo_id, grant.repo_id)
            done.append(Outcome(grant.job or "", repo, revoked=(grant.device,)))
        for grant, end in settled.renewed:
            done.append(Outcome(grant.job or "", note=f"renewed {grant.device} until {end}"))
        held = {g.job for g in read_grants(box.machine) if g.job}
        for job in jobs:
            if job.state != "RUNNING" or job.nodes != box.node or repo_named(job.comment) is None:
                continue
            if job_tag(cluster, job.job_id) in held or job.admin_comment.startswith("rdc:"):
                continue  # granted in an earlier round, or refused there (its cancel under way)
            done.append(ExternalGrant(box.machine, job_env(job, cluster, box), slurm).run())
    return done


def run_bridge(
    slurm: Machine,
    bridged: Sequence[Box],
    say: Callable[[str], None],
    *,
    interval: float = 2.0,
    once: bool = False,
) -> None:
    """Rounds every `interval` seconds (one with `once`); a round that fails is said and the next
    one tries again, since a controller that does not answer for a while must not stop the bridge."""
    while True:
        try:
            for outcome in bridge_round(slurm, bridged):
                say(outcome.line())
        except RdcError as exc:
            if once:
                raise
            say(f"rdc: bridge round failed: {exc.what}")
        if once:
            return
        time.sleep(interval)
