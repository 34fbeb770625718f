"""The invariants of an operator's world, written once for every suite (the stateful test of
`test_operator_world.py`, the e2e suite, a test of its own):

- every process of rdc that runs belongs to a repo `rdc repo list` shows, with the state its parts
  give it (`up`, `partial`), and is one of the parts it names (or a child of one);
- no grant in force reaches hardware other than what it was bound to;
- no two exclusive reservations of different repos overlap;
- every `What to do:` and `Next:` line printed names only `rdc` commands the CLI parser accepts.

Each check returns what is wrong, as sentences (empty: it holds), so a test can say all of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import click
from advice_kit import advised, parse_error

from rediacc_core.bindings import drift
from rediacc_core.cli import cli
from rediacc_core.grants.records import reachable, read_grants
from rediacc_core.grants.units import HardwareUnits, overlapping_units
from rediacc_core.machine import Machine
from rediacc_core.plugins import Plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime import status


def processes_marked(mark: str) -> dict[int, int]:
    """Every live process whose command line holds `mark`: pid -> parent pid."""
    found = {}
    needle = mark.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != "Z" and needle in cmdline:
            found[int(entry.name)] = int(fields[1])
    return found


def _pid(part: str) -> int:
    return int(part.rsplit("pid ", 1)[1].rstrip(")"))


def running_named(machine: Machine, listed: Mapping[str, str], processes: Mapping[int, int]) -> list[str]:
    """`processes` (pid -> parent: those of this machine's repos, found by a mark their command
    lines hold) each belong to a repo `listed` (ref -> STATUS, as `rdc repo list -o json` said) as one
    of its running parts, and each repo's status is the one its parts give it."""
    problems = []
    named: set[int] = set()
    for repo in RepoStore(machine).list():
        state, parts = status.repo_status(machine, repo)
        named.update(_pid(p) for p in parts)
        if listed.get(repo.ref) != state:
            problems.append(f"repo list says {repo.ref} is {listed.get(repo.ref)}, its parts say {state}")
    for pid, parent in sorted(processes.items()):
        if pid not in named and parent not in named:
            problems.append(f"process {pid} runs, but no repo `rdc repo list` shows names it")
    return problems


def grants_hold(machine: Machine, plugins: Plugins) -> list[str]:
    """No grant in force reaches other hardware than it was bound to (unless suspended, which reaches
    nothing), and no two exclusive reservations of different repos overlap."""
    problems = []
    units = HardwareUnits(machine, plugins)
    grants = reachable(read_grants(machine))
    for grant in grants:
        if grant.bound_to is not None:
            moved = drift(grant.bound_to, units.binding(grant.device))
            if moved is not None:
                problems.append(
                    f"grant {grant.device} of repo {grant.repo_id} reaches other hardware: {moved}"
                )
    for i, first in enumerate(grants):
        for second in grants[i + 1 :]:
            if first.repo_id == second.repo_id or not (first.exclusive or second.exclusive):
                continue
            if overlapping_units(units(first.device), units(second.device)):
                problems.append(
                    f"exclusive reservations overlap: {first.device} of {first.repo_id} and "
                    f"{second.device} of {second.repo_id}"
                )
    return problems


def advice_lines(text: str) -> list[str]:
    """The `What to do:` and `Next:` lines of what a command printed (with their continuations)."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(("What to do:", "Next:")):
            found.append(line)
            found += [more for more in lines[i + 1 : i + 4] if more.startswith("      ")]
    return found


def advice_parses(outputs: Iterable[str]) -> list[str]:
    """Every `rdc` command a `What to do:` or `Next:` line names is one the parser accepts."""
    commands = cli.list_commands(click.Context(cli))
    problems = []
    for text in outputs:
        for line in advice_lines(text):
            for argv in advised(line, commands):
                why = parse_error(argv, cli)
                if why is not None:
                    problems.append(f"rdc {' '.join(argv)}: {why} (printed: {line})")
    return problems
