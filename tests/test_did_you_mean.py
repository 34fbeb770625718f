"""A mistyped repo or machine name is answered with the nearest one that exists, and a client
config that names no machines is said so."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from rediacc_core.cli import cli
from rediacc_core.errors import EXIT_NOT_FOUND
from rediacc_core.testing import FakeMachine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_a_mistyped_machine_is_answered_with_the_nearest(rdc_config: Path, fake_machine: FakeMachine) -> None:
    assert rdc("machine", "add", "gpu-box", "--root", str(fake_machine.root)).exit_code == 0
    result = rdc("repo", "list", "gpu-bx")
    assert result.exit_code == EXIT_NOT_FOUND
    assert "What to do: did you mean gpu-box? run `rdc machine list`" in result.stderr


def test_a_mistyped_repo_is_answered_with_the_nearest(rdc_config: Path, fake_machine: FakeMachine) -> None:
    assert rdc("machine", "add", "m1", "--root", str(fake_machine.root)).exit_code == 0
    assert rdc("repo", "create", "trainer@m1").exit_code == 0
    named = rdc("repo", "docker-host", "trainr@m1")
    assert named.exit_code == EXIT_NOT_FOUND
    assert "What to do: did you mean trainer@m1? see the repos there" in named.stderr
    unnamed = rdc("repo", "docker-host", "trainr")
    assert unnamed.exit_code == EXIT_NOT_FOUND
    assert "What to do: did you mean trainer@m1? name the machine" in unnamed.stderr
    assert "did you mean" not in rdc("repo", "docker-host", "zzz@m1").stderr


def test_an_empty_client_config_is_said_not_silent(rdc_config: Path) -> None:
    rdc_config.write_text("")
    listed = rdc("machine", "list")
    assert listed.exit_code == 0
    assert f"Note: the client config {rdc_config} names no machines, so only localhost is listed" in (
        listed.stderr
    )
    rdc_config.unlink()
    assert "names no machines" not in rdc("machine", "list").stderr  # no file: nothing to point at
