"""The README's two commands are what CI runs: a newcomer's first block cannot drift from the one
that is proven on every submission."""

from __future__ import annotations

import re
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent


def first_block() -> list[str]:
    text = (TOP / "README.md").read_text(encoding="utf-8")
    section = text.split("## Two commands on a fresh machine", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the section has no sh block"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_shows_two_commands_that_need_only_the_distributions_python() -> None:
    commands = first_block()
    assert len(commands) == 2
    assert commands[0].startswith("python3 -m venv .venv && "), "tox goes in a venv, never the system Python"
    assert not any("pip install" in c and ".venv/bin/pip" not in c for c in commands)


def test_ci_runs_the_readmes_commands_with_the_distributions_python() -> None:
    ci = (TOP / ".ci" / "run").read_text(encoding="utf-8")
    setup, tests = first_block()
    for part in setup.split(" && ")[1:]:
        assert part in ci, f"CI does not run {part!r}"
    assert "/usr/bin/python3 -m venv .venv" in ci
    assert re.search(rf"^{re.escape(tests)} ", ci, re.M), f"CI does not run {tests!r}"
