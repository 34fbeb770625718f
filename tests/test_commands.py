"""Each `rdc` command is declared once, in `rediacc_core.commands`: the tree, its listings, shell
completion, where a command runs and the command reference are all read from that record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rediacc_core.cli import cli
from rediacc_core.cli.completion import COMPLETERS
from rediacc_core.cli.groups import load, walk
from rediacc_core.cli.reference import render
from rediacc_core.commands import TABLE, Command, children

REPO = Path(__file__).resolve().parent.parent


def _ids(records: tuple[Command, ...]) -> list[str]:
    return [" ".join(r.path) for r in records]


def test_the_tree_is_the_table() -> None:
    tree = {path for path, _ in walk(cli, click.Context(cli))}
    assert tree == {r.path for r in TABLE}


@pytest.mark.parametrize("record", TABLE, ids=_ids(TABLE))
def test_a_record_names_its_command_and_is_a_group_exactly_when_it_has_no_placement(record: Command) -> None:
    command = load(record)
    assert isinstance(command, click.Group) == record.group
    assert record.path[:-1] == () or record.path[:-1] in {r.path for r in TABLE if r.group}
    # The module holds the rest of the help: the record's summary leads it, said once.
    assert command.help is not None and command.help.startswith(record.summary)
    assert record.summary not in command.help[len(record.summary) :]


COMPLETING = tuple(r for r in TABLE if r.completes)


@pytest.mark.parametrize("record", COMPLETING, ids=_ids(COMPLETING))
def test_what_a_record_completes_is_a_parameter_of_its_command(record: Command) -> None:
    names = {p.name for p in load(record).params}
    assert set(record.completes) <= names, f"no such parameter: {set(record.completes) - names}"
    assert set(record.completes.values()) <= set(COMPLETERS)


def test_a_listing_shows_each_records_summary_and_leaves_hidden_commands_out() -> None:
    listed = CliRunner().invoke(cli, ["repo", "--help"], terminal_width=200).output
    for name, record in children(("repo",)).items():
        line = next((row for row in listed.splitlines() if row.strip().startswith(name + " ")), None)
        if record.hidden:
            assert line is None, f"`{name}` is hidden but listed"
        else:
            assert line is not None and record.summary.split(". ")[0].rstrip(".") in line


def test_help_lists_every_command_without_importing_one() -> None:
    code = (
        "import json, sys\n"
        "from rediacc_core.cli import main\n"
        "try:\n    main(['repo', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rediacc_core.cli.'))))\n"
    )
    argv = [sys.executable, "-c", code]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(proc.stdout.splitlines()[-1])
    # The group `repo` itself, and what the package always loads (the root, its groups, output).
    assert set(loaded) <= {"rediacc_core.cli.groups", "rediacc_core.cli.output", "rediacc_core.cli.repo"}
    assert "check " in proc.stdout and "tunnel " in proc.stdout  # listed from their records


def test_the_command_reference_is_current() -> None:
    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    assert page == render(), "rewrite it: python -m rediacc_core.cli.reference > docs/commands.md"
