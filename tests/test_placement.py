"""Every command of the click tree says where it runs for an SSH machine (its record in
`rediacc_core.commands`), and the dispatcher and the agent go by that one declaration."""

from __future__ import annotations

import io

import click
import pytest

from rediacc_core import commands, config
from rediacc_core.cli import cli
from rediacc_core.cli.groups import walk
from rediacc_core.remote import agent, protocol
from rediacc_core.remote.dispatch import PARAMS


def _commands() -> dict[tuple[str, ...], click.Command]:
    found = walk(cli, click.Context(cli))
    return {path: command for path, command in found if not isinstance(command, click.Group)}


def test_every_command_is_placed_and_every_group_is_not() -> None:
    # A record without a placement is a group; the tree is built from the records, so a command
    # without one would be a group that runs nothing.
    assert set(commands.PLACEMENTS) == set(_commands())


@pytest.mark.parametrize("path", sorted(commands.FORWARDED), ids=" ".join)
def test_a_forwarded_command_names_its_target_first_in_the_parameter_the_dispatcher_reads(
    path: tuple[str, ...],
) -> None:
    # `fast_target` reads the word after the path as the target; `parse_target` reads the parameter.
    arguments = [p for p in _commands()[path].params if isinstance(p, click.Argument)]
    wanted = PARAMS[commands.FORWARDED[path]]
    assert arguments and arguments[0].name in wanted, f"{' '.join(path)}: first argument is not {wanted}"


def test_only_read_only_commands_stop_when_their_client_leaves() -> None:
    assert commands.only_reads(["repo", "gate", "log", "a@m", "--follow"])
    assert commands.only_reads(["machine", "gpu", "list", "m", "-o", "json"])
    assert not commands.only_reads(["repo", "gate", "a@m"])  # `repo gate run a@m`, said shorter
    assert not commands.only_reads(["repo", "delete", "a@m", "--yes"])
    assert not commands.only_reads([])


def test_the_agent_runs_the_command_through_the_cli_it_is_handed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "_pinned", None)  # pin_machine below: undone after the test
    ran: list[list[str]] = []
    sender = protocol.Sender(io.BytesIO())

    def run_cli(argv: list[str]) -> None:
        ran.append(argv)
        assert sender.stop_when_gone  # set before the command runs
        print("listed")

    message = protocol.request(
        "run", machine="m", root="/srv/m", argv=["repo", "list", "m"], versions=protocol.versions()
    )
    assert agent.serve(message, sender, run_cli=run_cli) == 0
    assert ran == [["repo", "list", "m"]]
    assert isinstance(sender.stream, io.BytesIO)
    answers = [protocol.decode(line) for line in sender.stream.getvalue().splitlines()]
    assert {"out": "listed"} in answers
