"""`rdc repo docker-host | down | units`: what needs no running daemon (the rest runs in tests/e2e)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_STATE
from rediacc_core.gate import lifecycle
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.testing import FakeMachine


@pytest.fixture
def box(rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    fm = make_fake_machine("box")
    config = Config.load()
    config.add("box", fm.root)
    config.save()
    return Config.load().machine("box")


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_docker_host_prints_the_gates_socket_url(box: Machine) -> None:
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    result = rdc("repo", "docker-host", "alpha@box")
    assert result.exit_code == 0, result.output
    repo = RepoStore(box).get_by_label("alpha")
    assert result.stdout == f"unix://{lifecycle.runtime_for(box, repo).gate_socket}\n"


def test_down_on_a_repo_that_is_not_running_says_so(box: Machine) -> None:
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    result = rdc("repo", "down", "alpha@box")
    assert result.exit_code == 0, result.output
    assert "was not running" in result.stderr


def test_units_names_both_units_and_installs_the_templates(box: Machine, tmp_path: Path) -> None:
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    result = rdc("repo", "units", "alpha@box", "--install", str(tmp_path / "units"))
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [
        "rediacc-repo-dockerd@alpha@box.service",
        "rediacc-repo-gate@alpha@box.service",
    ]
    assert sorted(p.name for p in (tmp_path / "units").iterdir()) == [
        "rediacc-repo-dockerd@.service",
        "rediacc-repo-gate@.service",
    ]


def test_a_repo_on_an_existing_daemon_has_only_a_gate_unit(box: Machine) -> None:
    created = rdc("repo", "create", "beta@box", "--docker-host", "unix:///run/other/docker.sock")
    assert created.exit_code == 0, created.output
    assert rdc("repo", "units", "beta@box").stdout.split() == ["rediacc-repo-gate@beta@box.service"]
    dockerd = rdc("repo", "dockerd", "beta@box")
    assert dockerd.exit_code == EXIT_STATE
    assert "uses the existing daemon" in dockerd.stderr


def test_up_refuses_when_the_existing_daemon_does_not_answer(box: Machine) -> None:
    assert rdc("repo", "create", "beta@box", "--docker-host", "unix:///run/nothing/here.sock").exit_code == 0
    result = rdc("repo", "up", "beta@box")
    assert result.exit_code == EXIT_STATE
    assert "does not answer" in result.stderr
