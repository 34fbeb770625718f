"""GPU time Slurm allocated to each repo's leases on this node, as its accounting holds it.

`sacct` reports every job of the period with the node it ran on, its elapsed seconds and its
allocated TRES; a job counts for a repo of this machine when it ran on this machine's node, its
comment names the repo (`rdc-repo=NAME`, as a lease's does), its user or account may lease for the
repo (`slurm.access`, the prolog's own test) and rdc did not refuse it (a refusal's AdminComment
starts `rdc:`). The job comment reaches accounting only with `AccountingStoreFlags=job_comment` in
slurm.conf. `rdc repo gpu leases` shows a repo's hours; each gate's Slurm round writes every repo's
seconds for node_exporter beside the gates' counters (`slurm.prom`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rediacc_core.gate.audit.metrics import repo_labels, write_metrics_file
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.slurm import client
from rediacc_core.slurm.access import access_for
from rediacc_core.slurm.gres import read_map
from rediacc_core.slurm.hooks import repo_named

# A job's user writes its comment, a newline included: fields are split on a delimiter made anew
# for each read, which no comment can hold, so a line a comment forges has too few of them.
FIELDS = ("JobID", "User", "Account", "NodeList", "ElapsedRaw", "AllocTRES", "AdminComment", "Comment")
METRIC = "rediacc_slurm_gpu_seconds"


@dataclass(frozen=True)
class Accounted:
    """One job as `sacct -X -P` reports it."""

    job_id: str
    user: str
    account: str
    nodes: str
    elapsed: int  # seconds, so far for a running job
    gpus: int  # allocated `gres/gpu`
    admin_comment: str
    comment: str


def parse_sacct(text: str, delimiter: str) -> list[Accounted]:
    """The jobs of `sacct -X -n -P --delimiter=<delimiter> -o <FIELDS>` output; a line without
    exactly its fields is the rest of a comment, never a job."""
    found = []
    for line in text.splitlines():
        parts = line.split(delimiter)
        if len(parts) != len(FIELDS) or not parts[4].isdigit():
            continue
        job_id, user, account, nodes, elapsed, tres, admin, comment = parts
        found.append(
            Accounted(job_id, user, account, nodes, int(elapsed or 0), gpus_of(tres), admin, comment)
        )
    return found


def gpus_of(tres: str) -> int:
    """The `gres/gpu` count of an AllocTRES (`cpu=1,gres/gpu=2,gres/gpu:h100=2,mem=100M`)."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == "gres/gpu":
            return int(value) if value.isdigit() else 0
    return 0


def month_start(now: float) -> int:
    """The start of `now`'s month (UTC), where budgets are usually reset."""
    day = datetime.fromtimestamp(now, UTC)
    return int(day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp())


@dataclass(frozen=True)
class Usage:
    repo: Repo
    gpu_seconds: int
    jobs: tuple[str, ...]

    @property
    def gpu_hours(self) -> float:
        return round(self.gpu_seconds / 3600, 3)


def usage(
    machine: Machine, repos: list[Repo], since: int, slurm: Machine | None = None
) -> dict[str, Usage] | None:
    """Each repo's GPU seconds on this node since `since`, by repo id; None on no Slurm node. Slurm
    is asked with `slurm`'s tools (external mode: the bridge's host), else the machine's own."""
    found = read_map(machine)
    if found is None:
        return None
    start = datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    delimiter = f"|{secrets.token_hex(8)}|"
    argv = ["sacct", "-a", "-X", "-n", "-P", f"--delimiter={delimiter}", "-S", start, "-E", "now"]
    jobs = parse_sacct(client.run(slurm or machine, [*argv, "-o", ",".join(FIELDS)]), delimiter)
    by_label = {r.label: r for r in repos}
    seconds = {r.id: 0 for r in repos}
    counted: dict[str, list[str]] = {r.id: [] for r in repos}
    for job in jobs:
        repo = by_label.get(repo_named(job.comment) or "")
        if repo is None or job.nodes != found.node or job.admin_comment.startswith("rdc:"):
            continue
        if not access_for(machine, repo.id).admits(job.user or None, job.account or None):
            continue
        seconds[repo.id] += job.elapsed * job.gpus
        counted[repo.id].append(job.job_id)
    return {r.id: Usage(r, seconds[r.id], tuple(counted[r.id])) for r in repos}


def metrics_text(found: dict[str, Usage]) -> str:
    lines = [
        f"# HELP {METRIC} GPU seconds Slurm allocated to the repo's leases on this node this month (sacct).",
        f"# TYPE {METRIC} gauge",
    ]
    for u in sorted(found.values(), key=lambda u: u.repo.name):
        lines.append(f"{METRIC}{{{repo_labels(u.repo.id, u.repo.name)}}} {u.gpu_seconds}")
    return "\n".join(lines) + "\n"


def metrics_path(machine: Machine) -> Path:
    """Beside the gates' own files (`runtime.lifecycle.metrics_file`): one textfile directory."""
    return machine.run_dir / "metrics" / "slurm.prom"


def write_metrics(machine: Machine, repos: list[Repo], now: float) -> dict[str, Usage] | None:
    """Write every repo's GPU seconds of this month beside the gates' counters; what was written."""
    found = usage(machine, repos, month_start(now))
    if found is not None:
        write_metrics_file(metrics_path(machine), metrics_text(found))
    return found
