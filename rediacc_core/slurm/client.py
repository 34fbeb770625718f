"""A thin client over Slurm's own CLIs, run as the machine's programs, each with a time limit.

Reads go through `--json` where Slurm 22.05 offers it (`squeue`, `sacct`; 22.05's `squeue --json`
ignores `-j`, so jobs are filtered here) and through `-P` (parsable) output where it does not
(`sshare`, `scontrol show`). A Slurm command that fails or times out is a ToolError naming it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from rediacc_core.errors import ToolError
from rediacc_core.machine import Machine

TIMEOUT = 15.0  # seconds; a hook must never hang on a controller that does not answer

# States in which a job still holds its allocation (its grant must stay).
LIVE_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT", "RESIZING", "SIGNALING"}
)


@dataclass(frozen=True)
class Job:
    """One job as squeue reports it."""

    job_id: str
    state: str
    reason: str
    name: str
    user: str
    account: str
    comment: str
    admin_comment: str
    nodes: str
    start: int  # epoch seconds; 0 when not known
    end: int
    gpus: tuple[str, ...]  # gres_detail, e.g. `gpu:h100:1(IDX:0)`
    required_nodes: str = ""  # what it asked for (`--nodelist`), pending or not

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def end_iso(self) -> str | None:
        return None if self.end <= 0 else iso(self.end)

    @property
    def start_iso(self) -> str | None:
        return None if self.start <= 0 else iso(self.start)


def iso(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(machine: Machine, argv: Sequence[str], *, timeout: float = TIMEOUT) -> str:
    found = machine.run(list(argv), timeout=timeout)
    if not found.ok:
        detail = (found.stderr or found.stdout).strip().splitlines()
        raise ToolError(
            f"`{' '.join(argv)}` failed (exit {found.returncode}): {' '.join(detail[-3:]) or 'no output'}",
            "check that slurmctld answers (`scontrol ping`) and that this machine's slurm.conf names it",
        )
    return found.stdout


def _job(entry: Mapping[str, Any]) -> Job:
    state = entry.get("job_state")
    if isinstance(state, list):  # later Slurm releases give a list of flags
        state = state[0] if state else ""
    return Job(
        job_id=str(entry["job_id"]),
        state=str(state or ""),
        reason=str(entry.get("state_reason") or ""),
        name=str(entry.get("name") or ""),
        user=str(entry.get("user_name") or ""),
        account=str(entry.get("account") or ""),
        comment=str(entry.get("comment") or ""),
        admin_comment=str(entry.get("admin_comment") or ""),
        nodes=str(entry.get("nodes") or ""),
        start=_epoch(entry.get("start_time")),
        end=_epoch(entry.get("end_time")),
        gpus=tuple(str(g) for g in entry.get("gres_detail") or ()),
        required_nodes=str(entry.get("required_nodes") or ""),
    )


def _epoch(value: object) -> int:
    if isinstance(value, dict):  # later releases: {"set": true, "number": N}
        value = value.get("number")
    return value if isinstance(value, int) else 0


def parse_squeue(text: str) -> list[Job]:
    """The jobs of `squeue --json` output."""
    try:
        document = json.loads(text)
        return [_job(entry) for entry in document["jobs"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ToolError(
            f"squeue --json gave output rdc cannot read: {exc}", "check the Slurm version (22.05 or later)"
        ) from exc


def jobs(machine: Machine) -> list[Job]:
    """Every job the controller knows now (pending, running, recently ended)."""
    return parse_squeue(run(machine, ["squeue", "--json"]))


def job(machine: Machine, job_id: str) -> Job | None:
    return next((j for j in jobs(machine) if j.job_id == job_id), None)


def cluster_name(machine: Machine) -> str:
    for line in run(machine, ["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    raise ToolError("scontrol show config names no ClusterName", "set ClusterName in slurm.conf")


def _quote(reason: str) -> str:
    return reason.replace("\n", " ")[:900]


def cancel_after(machine: Machine, job_id: str, reason: str, pid: int) -> None:
    """The reason now; the cancel once process `pid` (the prolog) has ended, from a process of its
    own session (slurmd kills the prolog's process group when it exits). A job cancelled while its
    prolog runs leaves `salloc` waiting for the node to be ready until its resume timeout; after the
    prolog the job is cancelled as any other, and its epilog finds no grant."""
    run(machine, ["scontrol", "update", f"JobId={job_id}", f"AdminComment={_quote(reason)}"])
    scancel = machine.which("scancel")
    if scancel is None:
        raise ToolError(f"machine {machine.name} has no scancel", "install slurm-client")
    script = f"while kill -0 {pid} 2>/dev/null; do sleep 0.1; done; sleep 1; exec {scancel} {job_id}"
    subprocess.Popen(
        ["/bin/sh", "-c", script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def cancel_now(machine: Machine, job_id: str, reason: str) -> None:
    """The reason in the job's AdminComment, then the cancel (no prolog holds the job: external mode)."""
    run(machine, ["scontrol", "update", f"JobId={job_id}", f"AdminComment={_quote(reason)}"])
    run(machine, ["scancel", job_id])


def drain(machine: Machine, node: str, reason: str) -> None:
    run(machine, ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={_quote(reason)}"])


def resume(machine: Machine, node: str) -> None:
    run(machine, ["scontrol", "update", f"NodeName={node}", "State=RESUME"])


def node_state(machine: Machine, node: str) -> tuple[str, str]:
    """The node's state and its reason (`scontrol show node -o`)."""
    fields: dict[str, str] = {}
    text = run(machine, ["scontrol", "show", "node", node, "-o"]).strip()
    for part in text.split(" "):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    reason = text.split("Reason=", 1)[1] if "Reason=" in text else ""
    return fields.get("State", ""), reason.rsplit(" [", 1)[0].strip()


@dataclass(frozen=True)
class Budget:
    """An account's GPU minutes as slurmctld enforces them (`GrpTRESMins=gres/gpu=LIMIT(USED)`)."""

    account: str
    limit: int | None  # None: no limit set
    used: int

    @property
    def left(self) -> int | None:
        return None if self.limit is None else max(0, self.limit - self.used)

    @property
    def spent(self) -> float | None:
        """The share used, 0..1 (and beyond); None without a limit, 1.0 for a limit of 0."""
        if self.limit is None:
            return None
        return 1.0 if self.limit == 0 else self.used / self.limit


def parse_budget(text: str, account: str) -> Budget:
    """The account's own association (no user) in `scontrol show assoc_mgr flags=assoc` output."""
    for block in text.split("ClusterName=")[1:]:
        head = block.split(None, 3)
        if f"Account={account}" not in head or "UserName=" not in head:
            continue
        for word in block.split():
            if word.startswith("GrpTRESMins="):
                for item in word.removeprefix("GrpTRESMins=").split(","):
                    name, _, value = item.partition("=")
                    if name == "gres/gpu":
                        limit, _, used = value.partition("(")
                        return Budget(
                            account, None if limit == "N" else int(limit), int(float(used.rstrip(")") or 0))
                        )
    return Budget(account, None, 0)


def budget(machine: Machine, account: str) -> Budget:
    text = run(machine, ["scontrol", "show", "assoc_mgr", "flags=assoc", f"accounts={account}"])
    return parse_budget(text, account)


@dataclass(frozen=True)
class Share:
    """An account's fair share as `sshare` reports it: its share of the cluster (`NormShares`) and
    its share of the cluster's decayed usage (`EffectvUsage`), both 0..1. Slurm orders pending
    jobs by them (`PriorityType=priority/multifactor`, `PriorityWeightFairshare`)."""

    account: str
    share: float | None  # None: the account has no association sshare shows
    used: float | None


def parse_share(text: str, account: str) -> Share:
    """The account's own row (no user) of `sshare -n -P -o Account,User,NormShares,EffectvUsage`."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0].strip() == account and not parts[1]:
            return Share(account, _fraction(parts[2]), _fraction(parts[3]))
    return Share(account, None, None)


def _fraction(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def share(machine: Machine, account: str) -> Share:
    text = run(machine, ["sshare", "-n", "-P", "-A", account, "-o", "Account,User,NormShares,EffectvUsage"])
    return parse_share(text, account)
