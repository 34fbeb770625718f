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

A job that spans several nodes is not granted (an external lease is one box's cards), nor one past
its end: its grant lapsed there by itself (a lease's grant is absent from its `expires_at` on), and
slurmctld, which looks at time limits every 30 s, may still show it RUNNING for a while.

One box's part of a round is its step (`step`, `rdc slurm bridge-step`), which runs on the box and
calls no Slurm tool (a box of external mode has none): the bridge hands it the cluster's name and
the live jobs it read (the fields the step needs, `jobs_json`), and the step answers with its node
(its gres map's) and what it did; a job it refuses is named there with the reason, and the bridge
drains (where the prolog would) and cancels it through the Slurm tools of the operator's host. A
box whose files this host reads (a local or directory-rooted machine) runs its step in this process;
a box over SSH runs it through its `rdc-agent`, as every forwarded rdc command runs: one SSH call
per box a round.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rediacc_core.config import Config
from rediacc_core.errors import RdcError, StateError, ValidationError
from rediacc_core.files import atomic_write_json
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.remote.agentcall import Stream, run_remote
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

    node: str  # "" for a box over SSH until its step has said it
    machine: Machine


def boxes(machines: Iterable[Machine]) -> list[Box]:
    """The machines that are Slurm nodes of rdc's (a gres map written), with their node names; a
    machine over SSH is taken as it is named (its map is read there, by its step)."""
    found = []
    for machine in machines:
        if machine.remote is not None:
            found.append(Box("", machine))
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
    """The prolog's decision for a job on an external node, made on its box by the bridge's step:
    it calls no Slurm tool, so a refusal is only said (the bridge cancels the job) and the job's
    end is the one the bridge read."""

    def __init__(self, machine: Machine, env: dict[str, str], job: client.Job) -> None:
        super().__init__(machine, env)
        self.job = job

    def refuse(self, why: str, *, drain: bool = False) -> Outcome:
        return Outcome(self.tag, refused=why, drained=drain)

    def job_end(self) -> str | None:
        return self.job.end_iso


def job_env(job: client.Job, cluster: str, node: str, box: Machine) -> dict[str, str]:
    """The job as the prolog's environment would show it on `box`, Slurm node `node`."""
    return {
        "SLURM_JOB_ID": job.job_id,
        "SLURM_CLUSTER_NAME": cluster,
        "SLURM_JOB_COMMENT": job.comment,
        "SLURM_JOB_GPUS": gpu_indexes(job, box),
        "SLURM_JOB_USER": job.user,
        "SLURM_JOB_ACCOUNT": job.account,
        "SLURMD_NODENAME": node,
    }


@dataclass(frozen=True)
class Step:
    """One box's part of a round: its node, and what it granted, revoked, renewed and refused."""

    node: str
    done: list[Outcome] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "outcomes": [
                {
                    "job": o.job,
                    "repo": o.repo,
                    "granted": list(o.granted),
                    "revoked": list(o.revoked),
                    "refused": o.refused,
                    "drain": o.drained,
                    "note": o.note,
                }
                for o in self.done
            ],
        }

    @classmethod
    def from_json(cls, data: Any) -> Step:
        try:
            return cls(
                str(data["node"]),
                [
                    Outcome(
                        str(o["job"]),
                        str(o["repo"]),
                        tuple(str(d) for d in o["granted"]),
                        tuple(str(d) for d in o["revoked"]),
                        str(o["refused"]),
                        o["drain"] is True,
                        str(o["note"]),
                    )
                    for o in data["outcomes"]
                ],
            )
        except (KeyError, TypeError) as exc:
            raise StateError(
                f"a bridge step answered what this rdc cannot read ({exc!r})",
                "install this rdc's version on the box: rdc machine install MACHINE",
            ) from exc


def step(box: Machine, cluster: str, jobs: Sequence[client.Job]) -> Step:
    """One box's part of a round, on the box: reconcile its grants with `jobs` (the live ones Slurm
    runs), and grant each RUNNING job on its node that names a repo and holds no grant there yet, as
    the prolog decides. No Slurm tool is called: a refusal is in the answer, for the bridge."""
    gres = read_map(box)
    if gres is None:
        raise StateError(
            f"machine {box.name} has no gres map, so it is no Slurm node of rdc's",
            f"write it: rdc slurm gres {box.name} --node NODE --conf /etc/slurm/gres.conf",
        )
    done = Step(gres.node)
    settled = reconcile(box, (cluster, list(jobs)))
    refs = {r.id: r.ref for r in RepoStore(box).list()}
    for grant in settled.revoked:
        repo = refs.get(grant.repo_id, grant.repo_id)
        done.done.append(Outcome(grant.job or "", repo, revoked=(grant.device,)))
    for grant, end in settled.renewed:
        done.done.append(Outcome(grant.job or "", note=f"renewed {grant.device} until {end}"))
    held = {g.job for g in read_grants(box) if g.job}
    # Each run of a job is granted once: a grant the operator revoked while the job runs stays
    # revoked (`scancel` ends the job too). A job that left the live list (ended, or requeued and
    # pending) is forgotten, so a requeued job is granted again when it runs again.
    granted = _granted_tags(box) & {job_tag(cluster, j.job_id) for j in jobs if j.state == "RUNNING"}
    for job in jobs:
        if job.state != "RUNNING" or job.nodes != gres.node or repo_named(job.comment) is None:
            continue
        tag = job_tag(cluster, job.job_id)
        if tag in held or tag in granted or job.admin_comment.startswith("rdc:"):
            continue  # granted in an earlier round, or refused there (its cancel under way)
        if 0 < job.end <= time.time():
            continue  # past its time limit, its grant lapsed: slurmctld ends it within 30 s
        outcome = ExternalGrant(box, job_env(job, cluster, gres.node, box), job).run()
        if outcome.granted:
            granted.add(tag)
        done.done.append(outcome)
    atomic_write_json(_granted_path(box), sorted(granted))
    return done


def _granted_path(box: Machine) -> Path:
    return box.state_dir / "slurm" / "bridged.json"


def _granted_tags(box: Machine) -> set[str]:
    """The jobs the bridge granted on `box` (`slurm:<cluster>/<id>`), while they run."""
    try:
        found = json.loads(_granted_path(box).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set()
    except ValueError:
        return set()  # a torn or edited file: the grants file still says which jobs hold cards
    return {str(t) for t in found} if isinstance(found, list) else set()


# The fields of a job a step reads, and their names in `--jobs` (squeue's own, where it has one).
_FIELDS = {
    "job_id": "job_id",
    "state": "job_state",
    "user": "user_name",
    "account": "account",
    "comment": "comment",
    "admin_comment": "admin_comment",
    "nodes": "nodes",
    "end": "end_time",
    "gpus": "gres_detail",
}


def jobs_json(jobs: Iterable[client.Job]) -> str:
    """The live jobs of `jobs` as a step's `--jobs` reads them (the fields it needs, nothing else)."""
    return json.dumps(
        [{key: getattr(j, attr) for attr, key in _FIELDS.items()} for j in jobs if j.live],
        separators=(",", ":"),
    )


def read_jobs(text: str) -> list[client.Job]:
    """A step's `--jobs`: a JSON list of jobs, each with the fields `jobs_json` writes."""
    try:
        entries = json.loads(text)
        if not isinstance(entries, list):
            raise TypeError("not a list")
        return [
            client.Job(
                job_id=str(e["job_id"]),
                state=str(e["job_state"]),
                reason="",
                name="",
                user=str(e["user_name"]),
                account=str(e["account"]),
                comment=str(e["comment"]),
                admin_comment=str(e["admin_comment"]),
                nodes=str(e["nodes"]),
                start=0,
                end=int(e["end_time"]),
                gpus=tuple(str(g) for g in e["gres_detail"]),
            )
            for e in entries
        ]
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        raise ValidationError(
            f"--jobs is not a list of jobs as the bridge writes them ({exc!r}); "
            f"each has {', '.join(_FIELDS.values())}",
            "let `rdc slurm bridge` run the step: it writes --jobs from what squeue shows",
        ) from exc


def step_on(config: Config | None, box: Machine, cluster: str, jobs: Sequence[client.Job]) -> Step:
    """The box's step: in this process for a box whose files this host reads, else through the
    box's rdc-agent over SSH (one call)."""
    if box.remote is None:
        return step(box, cluster, jobs)
    assert config is not None, "a box over SSH is reached through the config that names it"
    argv = ["slurm", "bridge-step", box.name, "--cluster", cluster, "--jobs", jobs_json(jobs), "-o", "json"]
    out, err = Stream(), Stream()
    code = run_remote(config, box, argv, out, err)
    if code != 0:
        lines = err.value().strip().splitlines()
        said = next((line[7:] for line in lines if line.startswith("Error: ")), None)
        todo = next((line[12:] for line in lines if line.startswith("What to do: ")), None)
        raise RdcError(
            said or f"its bridge step failed (exit {code}): {lines[-1] if lines else 'no output'}",
            todo or f"see why on the box: rdc slurm bridge-step {box.name} --cluster {cluster}",
            exit_code=code,
        )
    try:
        answer = json.loads(out.value())
    except ValueError as exc:
        raise StateError(
            f"the bridge step on machine {box.name} answered no JSON ({exc})",
            f"install this rdc's version on it: rdc machine install {box.name}",
        ) from exc
    return Step.from_json(answer)


def bridge_round(slurm: Machine, bridged: Sequence[Box], config: Config | None = None) -> Iterator[Outcome]:
    """One round over every box; what it granted, revoked and refused, box by box. A box whose step
    fails is left for the next round and the others go on; the round then fails, naming it."""
    cluster = client.cluster_name(slurm)
    jobs = [j for j in client.jobs(slurm) if j.live]
    failed: list[str] = []
    claimed: dict[str, str] = {}  # node -> the box that answered for it this round
    for box in bridged:
        try:
            answer = step_on(config, box.machine, cluster, jobs)
            claim_node(claimed, answer.node, box.machine.name)
            for outcome in answer.done:
                if outcome.refused:
                    cancel_refused(slurm, box.machine.name, answer, outcome, jobs)
                yield outcome
        except RdcError as exc:  # one box, or one cancel, failing leaves the others their round
            failed.append(f"{box.machine.name}: {exc.what}" + (f" ({exc.todo})" if exc.todo else ""))
        except Exception as exc:  # a fault of this rdc's on one box must not starve the boxes after it
            failed.append(f"{box.machine.name}: {type(exc).__name__}: {exc}")
    for job in jobs:  # refused earlier, but its cancel failed: rdc alone writes an `rdc:` AdminComment
        if job.state == "RUNNING" and job.admin_comment.startswith("rdc: ") and job.nodes in claimed:
            try:
                client.cancel_now(slurm, job.job_id, job.admin_comment)
            except RdcError as exc:
                failed.append(f"job {job.job_id}: {exc.what}")
    if failed:
        raise RdcError(
            f"the bridge reached not every box: {'; '.join(failed)}",
            "see which machines answer: `rdc machine list`; the next round tries them again",
        )


def run_bridge(
    slurm: Machine,
    bridged: Sequence[Box],
    say: Callable[[str], None],
    *,
    interval: float = 1.0,
    once: bool = False,
    config: Config | None = None,
) -> None:
    """Rounds every `interval` seconds (one with `once`); a round that fails is said and the next
    one tries again, since a controller or a box that does not answer for a while must not stop the
    bridge."""
    while True:
        try:
            for outcome in bridge_round(slurm, bridged, config):
                say(outcome.line())
        except RdcError as exc:
            if once:
                raise
            say(f"rdc: bridge round failed: {exc.what}")
        if once:
            return
        time.sleep(interval)


def claim_node(claimed: dict[str, str], node: str, box: str) -> None:
    """Two boxes may not answer for one node (two gres maps naming it): both would grant its jobs."""
    owner = claimed.setdefault(node, box)
    if owner != box:
        raise StateError(
            f"machines {owner} and {box} both answer for Slurm node {node}",
            f"rewrite one's gres map for its own node: rdc slurm gres {box} --node NODE",
        )


def cancel_refused(
    slurm: Machine, box: str, answer: Step, outcome: Outcome, jobs: Sequence[client.Job]
) -> None:
    """Drain and cancel what a box's step refused, on the operator's host, only for a job that was
    sent to that box for its own node: a box's answer moves no other job or node (a box may be
    another administrator's, or broken into)."""
    job_id = outcome.job.rpartition("/")[2]
    if not any(j.job_id == job_id and j.nodes == answer.node for j in jobs):
        raise StateError(
            f"machine {box} refused job {job_id}, which is no job of its node {answer.node}",
            f"install this rdc's version on it: rdc machine install {box}",
        )
    reason = f"rdc: {outcome.refused}"
    if outcome.drained:
        client.drain(slurm, answer.node, reason)
    client.cancel_now(slurm, job_id, reason)
