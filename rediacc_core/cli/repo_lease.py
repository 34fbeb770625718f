"""`rdc repo gpu request|release|leases`: Slurm leases of a repo, asked for and ended from rdc."""

from __future__ import annotations

import time
from typing import Any

import click

from rediacc_core.cli.output import emit, note, output_option, table
from rediacc_core.config import Config
from rediacc_core.errors import RdcError
from rediacc_core.leases import parse_duration
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, resolve_ref
from rediacc_core.slurm.access import access_for
from rediacc_core.slurm.client import budget, iso, share
from rediacc_core.slurm.follow import after_grants_change
from rediacc_core.slurm.gres import read_map
from rediacc_core.slurm.requests import LeaseRequest, end, leases_of, submit
from rediacc_core.slurm.requests import leases as find
from rediacc_core.slurm.usage import month_start, usage


def lease_json(job: Any) -> dict[str, Any]:
    return {
        "job": job.job_id,
        "state": job.state,
        "reason": job.reason,
        "start": job.start_iso,
        "end": job.end_iso,
        "node": job.nodes,
        "account": job.account,
    }


@click.command("request")
@click.argument("ref", metavar="REPO")
@click.option("--gres", required=True, help="What to lease, as Slurm writes it: gpu:a100:1, gpu:2.")
@click.option("--for", "duration", required=True, metavar="DURATION", help="How long: 90m, 8h, 1d12h.")
@click.option("--mem", default="8G", show_default=True, help="Memory of the lease (never the whole node's).")
@click.option("--cpus", default=1, show_default=True, help="CPUs of the lease.")
@click.option("--account", help="The Slurm account to charge (default: the user's default account).")
@click.option("--constraint", help="Node features, e.g. ampere (see `rdc slurm gres`).")
@click.option("--reservation", help="A Slurm reservation to run in.")
@click.option(
    "--external",
    "via",
    metavar="MACHINE",
    help="External mode: submit an external job (`sbatch --external`) with MACHINE's Slurm tools "
    "(the host where `rdc slurm bridge` runs, e.g. localhost); the bridge grants it when it runs.",
)
@output_option("table", "json")
def request(
    ref: str,
    gres: str,
    duration: str,
    mem: str,
    cpus: int,
    account: str | None,
    constraint: str | None,
    reservation: str | None,
    via: str | None,
    fmt: str,
) -> None:
    """\b
    Examples:
      rdc repo gpu request gpu-a --gres gpu:a100:1 --for 8h --account team-a
      rdc repo gpu request gpu-a --gres gpu:1 --for 90m --constraint ampere -o json
      rdc repo gpu request gpu-a --gres gpu:1 --for 8h --external localhost
    """

    ask = LeaseRequest(
        gres, parse_duration(duration), mem, cpus, account, constraint, reservation, external=via is not None
    )
    config = Config.load()
    machine, found = resolve_ref(ref, config)
    job = submit(machine, found, ask, slurm=config.machine(via) if via else None)
    emit({"repo": found.ref, **lease_json(job)}, fmt, lambda _: "")
    if fmt != "json":
        when = f", expected to start {job.start_iso}" if job.state == "PENDING" and job.start_iso else ""
        why = f" ({job.reason})" if job.reason and job.reason != "None" else ""
        note(f"Job {job.job_id} for {found.ref}: {job.state}{why}{when}.")


@click.command("leases")
@click.argument("ref", metavar="REPO")
@click.option(
    "--external",
    "via",
    metavar="MACHINE",
    help="External mode: ask Slurm with MACHINE's Slurm tools (where `rdc slurm bridge` runs).",
)
@output_option("table", "json")
def leases(ref: str, via: str | None, fmt: str) -> None:
    """\b
    Examples:
      rdc repo gpu leases gpu-a
      rdc repo gpu leases gpu-a -o json | jq .budgets
      rdc repo gpu leases gpu-a --external localhost
    """

    config = Config.load()
    machine, found = resolve_ref(ref, config)
    slurm = config.machine(via) if via else None
    jobs = find(machine, found, slurm)
    accounts = dict.fromkeys(
        [*access_for(machine, found.id).accounts, *(j.account for j in jobs if j.account)]
    )
    budgets = [budget(slurm or machine, account) for account in accounts]
    rows = [lease_json(j) for j in jobs]
    since = month_start(time.time())
    used = (usage(machine, [found], since, slurm) or {}).get(found.id)
    hours = (
        None
        if used is None
        else {"since": iso(since), "gpuSeconds": used.gpu_seconds, "jobs": list(used.jobs)}
    )
    shares = {a: share(slurm or machine, a) for a in accounts}
    money = [
        {
            "account": b.account,
            "limitMinutes": b.limit,
            "usedMinutes": b.used,
            "leftMinutes": b.left,
            "share": shares[b.account].share,
            "shareUsed": shares[b.account].used,
        }
        for b in budgets
    ]
    emit(
        {"repo": found.ref, "leases": rows, "budgets": money, "used": hours},
        fmt,
        lambda d: (
            table(
                ["JOB", "STATE", "REASON", "START", "END", "NODE"],
                [
                    [r["job"], r["state"], r["reason"], r["start"], r["end"], r["node"] or None]
                    for r in d["leases"]
                ],
            )
            + "\n\n"
            + table(
                ["ACCOUNT", "GPU MINUTES LEFT", "USED", "LIMIT", "FAIR SHARE", "OF USAGE"],
                [
                    [
                        b["account"],
                        b["leftMinutes"],
                        b["usedMinutes"],
                        b["limitMinutes"],
                        _percent(b["share"]),
                        _percent(b["shareUsed"]),
                    ]
                    for b in d["budgets"]
                ],
            )
        ),
    )
    if used is not None and fmt != "json":
        note(
            f"{found.ref}'s leases on this node since {iso(since)}: {used.gpu_hours} GPU hours "
            f"in {len(used.jobs)} jobs (sacct)."
        )
    for line in _warnings(budgets):
        note(line)


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{value * 100:.1f} %"


def _warnings(budgets: Any) -> list[str]:
    """A warning for each account that has used 80 % of its GPU minutes or more."""
    return [
        f"Warning: account {b.account} has used {b.used} of its {b.limit} GPU minutes"
        + (": its leases do not start" if b.left == 0 else "")
        + f" (sacctmgr modify account where name={b.account} set GrpTRESMins=gres/gpu=N)."
        for b in budgets
        if b.spent is not None and b.spent >= 0.8
    ]


def lease_text(job: Any) -> str:
    """One lease in a word or two: `42 RUNNING until …`, `43 PENDING (Resources)`."""
    if job.state == "PENDING":
        why = f" ({job.reason})" if job.reason and job.reason != "None" else ""
        return f"{job.job_id} PENDING{why}"
    return f"{job.job_id} {job.state}" + (f" until {job.end_iso}" if job.end_iso else "")


def slurm_leases(machine: Machine, repos: list[Repo]) -> tuple[dict[str, list[Any]] | None, list[str]]:
    """The repos' Slurm leases by repo id (None when the machine is no Slurm node, or Slurm did not
    answer) and the lines to say: the budget warnings of their accounts, or why none are shown.
    Never raises for Slurm: a listing stands without it."""

    try:
        if read_map(machine) is None:
            return None, []
        found = leases_of(machine, repos)
        accounts = dict.fromkeys(
            [
                *(a for r in repos for a in access_for(machine, r.id).accounts),
                *(j.account for jobs in found.values() for j in jobs if j.account),
            ]
        )
        return found, _warnings([budget(machine, a) for a in accounts])
    except (RdcError, OSError) as exc:
        what = exc.what if isinstance(exc, RdcError) else str(exc)
        return None, [f"Slurm leases not shown ({machine.name}): {what}"]


@click.command("release")
@click.argument("ref", metavar="REPO")
@click.option("--job", "job_id", help="Only this job (default: every lease of REPO).")
@click.option(
    "--external",
    "via",
    metavar="MACHINE",
    help="External mode: cancel with MACHINE's Slurm tools (where `rdc slurm bridge` runs).",
)
def release(ref: str, job_id: str | None, via: str | None) -> None:
    """\b
    Examples:
      rdc repo gpu release gpu-a
      rdc repo gpu release gpu-a --job 42
      rdc repo gpu release gpu-a --external localhost
    """

    config = Config.load()
    machine, found = resolve_ref(ref, config)
    for name in end(machine, found, job_id, config.machine(via) if via else None):
        note(f"Revoked {name} from {found.ref}.")


def slurm_follows(machine: Machine) -> None:
    """A Slurm node drained for a suspended grant is resumed once none is left (`slurm.drains`)."""
    said = after_grants_change(machine)
    if said:
        note(said)


def lease_lines(machine: Machine, found: Repo) -> None:
    """On a Slurm node: the repo's leases, pending and running, and its accounts' budget warnings."""
    leases, said = slurm_leases(machine, [found])
    for job in (leases or {}).get(found.id, []):
        note(f"Slurm lease of {found.ref}: job {lease_text(job)} (rdc repo gpu leases {found.ref}).")
    for line in said:
        note(line)
