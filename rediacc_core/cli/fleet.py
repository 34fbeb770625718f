"""Fleet views: one listing asked of every machine at once (`--all`), local and SSH alike.

Each machine is asked in its own thread with the ordinary command and `-o json`, so the fleet
view costs about the slowest machine, not the sum. A machine that fails is a row of its own with
its error; the others are still shown, and the exit code says that some failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from rediacc_core.cli.output import emit, note, table
from rediacc_core.config import LOCALHOST, Config
from rediacc_core.errors import EXIT_GENERAL, ValidationError
from rediacc_core.inventory import read_inventory_text
from rediacc_core.machine import Machine
from rediacc_core.remote.agentcall import Stream, run_remote

MAX_PARALLEL = 32
LOCAL_TIMEOUT = 120


@dataclass(frozen=True)
class Answer:
    machine: str
    data: Any = None
    error: str | None = None
    exit: int = 0


def ask_all(argv_for: Callable[[str], list[str]]) -> list[Answer]:
    """`rdc ARGV -o json` on every machine, in parallel, in the order of `rdc machine list`."""
    config = Config.load()
    machines = [m for m in config.machines() if not _idle_localhost(m)]
    if not machines:
        return []
    answers: list[Answer | None] = [None] * len(machines)
    slots = threading.BoundedSemaphore(MAX_PARALLEL)

    def ask(index: int, machine: Machine) -> None:
        with slots:
            try:
                answers[index] = _ask(config, machine, [*argv_for(machine.name), "-o", "json"])
            except Exception as exc:  # one machine's bug is its own row, as any failure
                answers[index] = Answer(machine.name, error=f"{type(exc).__name__}: {exc}", exit=EXIT_GENERAL)

    # Plain threads, not concurrent.futures: its import (and logging's) costs more than the threads.
    threads = [threading.Thread(target=ask, args=(i, m), daemon=True) for i, m in enumerate(machines)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # An empty slot: the thread died of what `except Exception` does not catch (SystemExit).
    return [
        a if a is not None else Answer(m.name, error="no answer", exit=EXIT_GENERAL)
        for a, m in zip(answers, machines, strict=True)
    ]


def _idle_localhost(machine: Machine) -> bool:
    # A laptop is not a GPU machine: localhost is shown only once it has been set up.
    return machine.name == LOCALHOST and read_inventory_text(machine) is None


def _ask(config: Config, machine: Machine, argv: list[str]) -> Answer:
    if machine.remote is not None:
        out, err = Stream(), Stream()
        code = run_remote(config, machine, argv, out, err)
        stdout, stderr = out.value(), err.value()
    else:
        # A process of its own: commands print through the process-wide streams.
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "rediacc_core.cli", *argv],
                capture_output=True,
                text=True,
                timeout=LOCAL_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            return Answer(machine.name, error=f"no answer within {LOCAL_TIMEOUT}s", exit=EXIT_GENERAL)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    if code != 0:
        return Answer(machine.name, error=_error_line(stderr) or f"exit {code}", exit=code)
    try:
        return Answer(machine.name, data=json.loads(stdout))
    except ValueError:
        return Answer(machine.name, error="the answer was not JSON", exit=EXIT_GENERAL)


def _error_line(stderr: str) -> str:
    lines = [line.removeprefix("Error: ") for line in stderr.splitlines() if line.startswith("Error: ")]
    return lines[-1] if lines else stderr.strip()


def exit_code(answers: list[Answer]) -> int:
    """0 when every machine answered; else the first failure's code."""
    return next((a.exit for a in answers if a.exit != 0), 0)


def as_json(answers: list[Answer], key: str) -> list[dict[str, Any]]:
    return [
        {"machine": a.machine, key: a.data} if a.error is None else {"machine": a.machine, "error": a.error}
        for a in answers
    ]


# --- the two fleet views ------------------------------------------------------------------------------


def gpu_rows(answers: list[Answer]) -> list[list[object]]:
    rows: list[list[object]] = []
    for a in answers:
        if a.error is not None:
            rows.append([a.machine, None, f"(failed) {a.error}", None, None, None])
            continue
        gpus = a.data.get("gpus", []) if isinstance(a.data, dict) else []
        if not gpus:
            rows.append([a.machine, None, "(no GPUs)", None, None, None])
        for g in gpus:
            memory = g.get("memoryMiB")
            names = ", ".join(g.get("cdiNames", [])[:1]) or None
            rows.append([a.machine, g.get("index"), g.get("name"), g.get("vendor"), _mib(memory), names])
    return rows


REPO_HEADERS = ["MACHINE", "REPO", "ID", "GPU GRANTS"]


def repo_rows(answers: list[Answer]) -> tuple[list[str], list[list[object]]]:
    """The headers and rows of `rdc repo list --all`: a machine that did not answer is a row with
    its error in a FAILURE column of its own (there only when one failed), never in REPO."""
    failed = any(a.error is not None for a in answers)
    # A LEASES column when some machine is a Slurm node that answered (its repos have `leases`).
    slurm = any("leases" in r for a in answers for r in a.data or [])
    rows: list[list[object]] = []
    for a in answers:
        if a.error is not None:
            rows.append([a.machine, None, None, None, *([None] if slurm else []), a.error])
            continue
        for r in a.data or []:
            grants = ", ".join(g["device"] + (" *" if g["exclusive"] else "") for g in r.get("grants", []))
            held = ", ".join(_lease_cell(j) for j in r.get("leases", [])) or None
            rows.append(
                [a.machine, r.get("ref"), r.get("id"), grants or None]
                + ([held] if slurm else [])
                + ([None] if failed else [])
            )
    headers = [*REPO_HEADERS, *(["LEASES"] if slurm else [])]
    return ([*headers, "FAILURE"] if failed else headers), rows


def _lease_cell(job: dict[str, object]) -> str:
    """A lease of `rdc repo list M -o json` as `rdc repo list` words it (`cli.repo_lease.lease_text`)."""
    if job.get("state") == "PENDING":
        reason = job.get("reason")
        return f"{job.get('job')} PENDING" + (f" ({reason})" if reason and reason != "None" else "")
    return f"{job.get('job')} {job.get('state')}" + (f" until {job['end']}" if job.get("end") else "")


def _mib(value: object) -> str | None:
    return f"{value} MiB" if isinstance(value, int) else None


def _check_choice(name: str | None, every: bool, command: str) -> None:
    if every == (name is None):
        return
    raise ValidationError(
        f"{command} takes a machine or --all, not {'both' if every else 'neither'}",
        f"e.g. `{command} gpu1` or `{command} --all`",
    )


def fleet_gpu_list(name: str | None, every: bool, fmt: str) -> None:
    """`rdc machine gpu list --all`."""
    _check_choice(name, every, "rdc machine gpu list")
    answers = ask_all(lambda machine: ["machine", "gpu", "list", machine])
    headers = ["MACHINE", "GPU", "NAME", "VENDOR", "MEMORY", "CDI NAME"]
    emit(as_json(answers, "inventory"), fmt, lambda _data: table(headers, gpu_rows(answers)))
    _finish(answers)


def fleet_repo_list(name: str | None, every: bool, fmt: str) -> None:
    """`rdc repo list --all`."""
    _check_choice(name, every, "rdc repo list")
    answers = ask_all(lambda machine: ["repo", "list", machine])
    emit(as_json(answers, "repos"), fmt, lambda _data: table(*repo_rows(answers)))
    _finish(answers)


def _finish(answers: list[Answer]) -> None:
    failed = [a.machine for a in answers if a.error is not None]
    if failed:
        note(f"{len(failed)} of {len(answers)} machine(s) did not answer: {', '.join(failed)}")
        raise click.exceptions.Exit(exit_code(answers))
