"""`rdc repo check`: what the repo's gate would decide for a Compose file or a `docker run` line, before
anything is sent. The requests they would make are decided by the gate's own decider, against the
repo's grants in force and the machine's settings, read as a running gate reads them."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from rediacc_core.cli.check_docker import CheckedRequest, from_docker
from rediacc_core.cli.compose_bodies import solve_message
from rediacc_core.cli.output import emit, note, output_option
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_REFUSED, ValidationError
from rediacc_core.gate.decide.decider import Decider
from rediacc_core.gate.decide.decision import Decision, Forward, Refuse
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import Repo, resolve_ref


def requests_of(words: tuple[str, ...]) -> tuple[list[CheckedRequest], list[str]]:
    """The requests a Compose file (one word: its path) or a docker command line would send, and
    notes on what the installed Compose reads but does not send."""
    from rediacc_core.cli.check_compose import file_line, from_compose, parse_compose

    if len(words) == 1 and not words[0].startswith("docker"):
        return from_compose(file_line(Path(words[0])))
    if words[:1] != ("docker",):
        raise ValidationError(
            f"rdc repo check reads docker and docker compose command lines only, not {shlex.join(words[:1])}",
            "write it as: rdc repo check REPO -- docker run|create [OPTIONS] IMAGE [COMMAND], or "
            "rdc repo check REPO -- docker compose [-f FILE] up, or name a Compose file",
        )
    if words[1:2] == ("compose",):
        return from_compose(parse_compose(words[2:]))
    return from_docker(words), []


def decide(
    machine: Machine, found: Repo, requests: list[CheckedRequest]
) -> list[tuple[CheckedRequest, Decision]]:
    """Each request decided as the repo's gate decides it now, nothing sent or mounted. An image's
    own settings (its exposed ports, its environment) are not known here: decided as if it had none."""
    import json

    decider = Decider(machine, found, get_plugins(), lambda image: None, lambda line: None, pinning=False)
    return [
        (r, _solve(decider, r))
        if r.method == "GRPC"
        else (r, decider.decide(r.method, r.target, "application/json", json.dumps(r.body).encode()))
        for r in requests
    ]


def _solve(decider: Decider, request: CheckedRequest) -> Decision:
    """A build's solve request, judged as the gate judges BuildKit's calls on `/grpc`."""
    verdict = decider.judge_grpc(request.target, solve_message(request.body))
    if not verdict.refused:
        return Forward(endpoint="grpc")
    refusals = tuple(finding.refusal for finding in verdict.findings)
    return Refuse(
        403,
        "; ".join(r.message for r in refusals),
        endpoint="grpc",
        rules=tuple(dict.fromkeys(r.rule for r in refusals)),
        refusals=refusals,
    )


def _refusals(decision: Decision) -> list[dict[str, Any]]:
    if not isinstance(decision, Refuse):
        return []
    if decision.refusals:
        return [{"rule": r.rule, "message": r.message, "instead": r.replacement} for r in decision.refusals]
    return [{"rule": (decision.rules or ("",))[0], "message": decision.message, "instead": None}]


def _render(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        lines.append(f"{row['request']}: {'admitted' if row['admitted'] else 'refused'}")
        for refusal in row["refusals"]:
            lines.append(f"  [{refusal['rule']}] {refusal['message']}")
            if refusal["instead"]:
                lines.append(f"    instead: {refusal['instead']}")
    return "\n".join(lines)


@click.command("check", context_settings={"ignore_unknown_options": True})
@click.argument("ref", metavar="REPO-REF")
@click.argument("what", nargs=-1, required=True, type=click.UNPROCESSED, metavar="COMPOSE-FILE | -- docker …")
@output_option("table", "json", "yaml")
def check(ref: str, what: tuple[str, ...], fmt: str) -> None:
    """Each request they would make (each service's container, each named volume and network) is
    decided by the gate's own rules, against the repo's grants in force and the machine's settings.
    Every refusal is printed with what to use instead; the exit code is 4 when any would be refused.
    A Compose project is read by the installed Compose (docker compose config), with the same
    options, as `docker compose up` reads it. On an SSH machine the check runs there, and a Compose
    file is read there.

    \b
    Examples:
      rdc repo check gpu-a compose.yaml
      rdc repo check gpu-a -- docker run --rm --device vendor.example/gpu=0 ubuntu true
      rdc repo check gpu-a -- docker compose -f compose.yaml up -d
      rdc repo check gpu-a compose.yaml -o json
    """
    machine, found = resolve_ref(ref, Config.load())
    requests, notes = requests_of(what)
    decided = decide(machine, found, requests)
    rows = [
        {
            "request": r.what,
            "admitted": d.forward,
            "status": d.status,
            "refusals": _refusals(d),
        }
        for r, d in decided
    ]
    emit(rows, fmt, _render)
    for line in notes:
        note(line)
    refused = [row for row in rows if not row["admitted"]]
    if refused:
        note(
            f"The gate of repo {found.ref} would refuse {len(refused)} of {len(rows)} requests of "
            f"{shlex.join(what)}; change what each refusal names, then check again."
        )
        raise click.exceptions.Exit(EXIT_REFUSED)
    note(f"The gate of repo {found.ref} would admit all {len(rows)} requests of {shlex.join(what)}.")
