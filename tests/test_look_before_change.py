"""Commands look at what runs before they change anything: `rdc demo` does not rebuild (or move) a
demo machine under a running repo, `rdc machine remove` does not forget a machine whose repos run;
each refuses naming the repo, what of it runs and the `rdc repo down` that frees it, and `rdc demo
--stop` stops them first. A running part here is a real process named by the repo's pidfile, as
`rdc repo list` reads it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from setup_kit import FakeVendor

from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_STATE
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import layout, lifecycle, status
from rediacc_core.testing import FakeMachine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def stand_ins() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def run_gate(machine: Machine, repo: Repo, started: list[subprocess.Popen[bytes]]) -> int:
    """A process standing in for the repo's gate, named by its pidfile: the repo runs."""
    runtime = layout.runtime_for(machine, repo)
    process = subprocess.Popen(["sleep", "600"])
    started.append(process)
    runtime.run_dir.mkdir(parents=True, exist_ok=True)
    lifecycle._record_fallback(machine, repo, runtime)  # as `repo up` does, where the root is deep
    runtime.gate.record(process.pid)
    return process.pid


def demo_repo(name: str = "y") -> tuple[Machine, Repo]:
    machine = Config.load().machine("demo")
    # On an existing daemon: `repo down` then stops only the gate (no namespace to tear down here).
    return machine, RepoStore(machine).create(name, docker_host="unix:///nonexistent/docker.sock")


def test_demo_refuses_to_rebuild_under_a_running_repo(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    assert rdc("demo", "--workdir", str(tmp_path / "d")).exit_code == 0
    machine, repo = demo_repo()
    pid = run_gate(machine, repo, stand_ins)

    again = rdc("demo")

    assert again.exit_code == EXIT_STATE, again.output
    assert f"repos of machine demo are running (y@demo: gate (pid {pid}))" in again.stderr
    assert "What to do: stop them first: rdc repo down y@demo; or rdc demo --stop" in again.stderr
    assert RepoStore(machine).get_by_label("y").id == repo.id  # nothing deleted
    assert status.running_parts(machine, repo) == [f"gate (pid {pid})"]


def test_demo_stop_stops_the_running_repos_then_rebuilds(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    assert rdc("demo", "--workdir", str(tmp_path / "d")).exit_code == 0
    machine, repo = demo_repo()
    pid = run_gate(machine, repo, stand_ins)

    again = rdc("demo", "--stop")

    assert again.exit_code == 0, again.output
    assert f"Gate (pid {pid})" in again.stderr and "Stopped repo y@demo." in again.stderr
    assert stand_ins[0].wait(10) is not None
    assert lifecycle.running_repos(machine) == []


def test_demo_elsewhere_refuses_to_leave_a_running_repo_behind(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    assert rdc("demo", "--workdir", str(tmp_path / "d")).exit_code == 0
    machine, repo = demo_repo()
    run_gate(machine, repo, stand_ins)

    moved = rdc("demo", "--workdir", str(tmp_path / "other"))

    assert moved.exit_code == EXIT_STATE and "rdc repo down y@demo" in moved.stderr
    assert Config.load().machine("demo").root == tmp_path / "d" / "root"  # not re-pointed
    assert not (tmp_path / "other").exists()


def test_demo_elsewhere_says_it_moves_when_nothing_runs(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path
) -> None:
    assert rdc("demo", "--workdir", str(tmp_path / "d")).exit_code == 0
    moved = rdc("demo", "--workdir", str(tmp_path / "other"))
    assert moved.exit_code == 0, moved.output
    old, new = tmp_path / "d" / "root", tmp_path / "other" / "root"
    assert f"The demo machine moves from {old} to {new}; {old} is left as it was." in moved.stderr


def test_machine_remove_refuses_while_a_repo_runs(
    rdc_config: Path, fake_machine: FakeMachine, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    assert rdc("machine", "add", "box", "--root", str(fake_machine.root)).exit_code == 0
    machine = Config.load().machine("box")
    repo = RepoStore(machine).create("job", docker_host="unix:///nonexistent/docker.sock")
    pid = run_gate(machine, repo, stand_ins)

    refused = rdc("machine", "remove", "box")

    assert refused.exit_code == EXIT_STATE
    assert f"not forgetting machine box: repos of machine box are running (job@box: gate (pid {pid}))" in (
        refused.stderr
    )
    assert Config.load().has("box")
    stand_ins[0].kill()
    stand_ins[0].wait()
    assert rdc("machine", "remove", "box").exit_code == 0


def test_a_deleted_repos_running_parts_are_named_and_refuse_the_rebuild(
    vendor: FakeVendor, rdc_config: Path, tmp_path: Path, stand_ins: list[subprocess.Popen[bytes]]
) -> None:
    """Processes of a repo whose record was deleted by hand (or by an older rdc) while it ran: no
    `rdc repo down` can name them, so `repo list` and the refusal give their pids."""
    from rediacc_core.grants.records import delete_repo

    assert rdc("demo", "--workdir", str(tmp_path / "d")).exit_code == 0
    machine, repo = demo_repo()
    pid = run_gate(machine, repo, stand_ins)
    delete_repo(machine, repo)  # the record only, as an older rdc's walkthrough did
    run_dir = layout.runtime_for(machine, repo).run_dir

    listed = rdc("repo", "list", "demo")
    assert f"Note: a deleted repo's gate (pid {pid}) (under {run_dir}) still run on demo" in listed.stderr
    assert f"no repo names them: kill {pid}" in listed.stderr
    again = rdc("demo")
    assert again.exit_code == EXIT_STATE
    assert f"stop them first: kill {pid}" in again.stderr and "rdc demo --stop" not in again.stderr
