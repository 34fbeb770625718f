"""Every `rdc …` command an error or a refusal advised during this test session is one the CLI
accepts: its command path, its options and its arguments (run last, over what the suite produced)."""

from __future__ import annotations

import click
import pytest
from advice_kit import ADVICE, advised, parse_error

from rediacc_core.cli import cli


def test_every_advised_command_is_accepted_by_the_parser() -> None:
    if not ADVICE:
        pytest.skip("run with the suites whose errors and refusals it reads (it reads nothing alone)")
    failures = []
    for text in sorted(ADVICE):
        for argv in advised(text, cli.list_commands(click.Context(cli))):
            why = parse_error(argv, cli)
            if why is not None:
                failures.append(f"rdc {' '.join(argv)}: {why}\n    advised in: {text}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    ("text", "commands"),
    [
        (
            "no grant (rdc repo gpu grant a@m --device v/g=0)",
            [["repo", "gpu", "grant", "a@m", "--device", "v/g=0"]],
        ),
        ("run `rdc machine setup m1` first", [["machine", "setup", "m1"]]),
        ("check with `rdc repo list <machine>`", [["repo", "list", "x"]]),
        ("sudo rdc repo up a@m; then rdc repo list m.", [["repo", "up", "a@m"], ["repo", "list", "m"]]),
        ("rdc repo create a@m -o json | jq .id", [["repo", "create", "a@m", "-o", "json"]]),
    ],
)
def test_commands_are_read_out_of_the_advice(text: str, commands: list[list[str]]) -> None:
    assert advised(text, ["machine", "repo"]) == commands


def test_prose_about_rdc_is_no_command_but_a_misspelt_one_is() -> None:
    assert advised("a form rdc cannot rewrite", ["machine", "repo"]) == []
    assert advised("run rdc repos list", ["machine", "repo"]) == [["repos", "list"]]


def test_the_parser_refuses_what_the_cli_does_not_take() -> None:
    assert parse_error(["repo", "gpu", "grant", "a@m", "--device", "v/g=0"], cli) is None
    assert "No such option" in (parse_error(["repo", "gpu", "grant", "a@m", "--stop"], cli) or "")
    assert "No such command" in (parse_error(["repo", "grantt", "a@m"], cli) or "")
    assert "Missing argument" in (parse_error(["repo", "up"], cli) or "")
