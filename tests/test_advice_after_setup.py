"""Advice that follows what was done: a machine whose setup found no GPU is not told to run setup
again for a grant, and `rdc machine refresh` of a machine never set up refuses (pointing at setup)
instead of creating its state directory; and an ended lease is named where a lease matters."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from click.testing import CliRunner, Result
from setup_kit import FakeVendor

from rediacc_core.cli import cli
from rediacc_core.cli.output import runnable_rdc
from rediacc_core.errors import EXIT_STATE, EXIT_VALIDATION
from rediacc_core.testing import FakeMachine


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_a_grant_on_a_machine_set_up_without_gpus_is_not_told_to_set_it_up(
    vendor: FakeVendor, rdc_config: Path, fake_machine: FakeMachine
) -> None:
    assert rdc("machine", "add", "bare", "--root", str(fake_machine.root)).exit_code == 0
    set_up = rdc("machine", "setup", "bare")
    assert set_up.exit_code == 0 and "0 GPU(s)" in set_up.stderr
    assert rdc("repo", "create", "a@bare").exit_code == 0

    refused = rdc("repo", "gpu", "grant", "a@bare", "--device", "vendor.example/gpu=0")

    assert refused.exit_code == EXIT_VALIDATION
    assert "machine bare has no GPU that a CDI spec names (its setup found none)" in refused.stderr
    assert "rdc machine setup" not in refused.stderr


def test_refresh_of_a_machine_never_set_up_refuses_and_creates_nothing(
    vendor: FakeVendor, rdc_config: Path, fake_machine: FakeMachine
) -> None:
    assert rdc("machine", "add", "new", "--root", str(fake_machine.root)).exit_code == 0
    before = sorted(p.relative_to(fake_machine.root) for p in fake_machine.root.rglob("*"))

    for args in (["machine", "refresh", "new"], ["machine", "refresh", "new", "--dry-run"]):
        refused = rdc(*args)
        assert refused.exit_code == EXIT_STATE, refused.output
        assert "machine new has not been set up" in refused.stderr
        assert "What to do: run `rdc machine setup new`" in refused.stderr
    assert sorted(p.relative_to(fake_machine.root) for p in fake_machine.root.rglob("*")) == before


def test_setups_next_line_runs_as_printed_from_a_shell(
    vendor: FakeVendor, rdc_config: Path, fake_machine: FakeMachine
) -> None:
    """With $REDIACC_CONFIG naming the config (as the demo's lines do), setup's "Next:" names it and
    the rdc that ran, so it runs as printed from a shell without $REDIACC_CONFIG."""
    assert rdc("machine", "add", "box", "--root", str(fake_machine.root)).exit_code == 0
    set_up = rdc("machine", "setup", "box")
    [line] = [line for line in set_up.stderr.splitlines() if line.startswith("Next: ")]
    assert line == f"Next: REDIACC_CONFIG={rdc_config} {runnable_rdc()} machine gpu list box"
    env = {"PATH": os.environ["PATH"], "HOME": str(rdc_config.parent), "REDIACC_LOAD_PLUGINS": ""}
    ran = subprocess.run(["bash", "-c", line.removeprefix("Next: ")], capture_output=True, text=True, env=env)
    assert ran.returncode == 0, ran.stderr
    assert "Example GPU" in ran.stdout or "GPU" in ran.stdout


def test_repo_gpu_list_names_an_ended_lease(rdc_config: Path, fake_machine: FakeMachine) -> None:
    from rediacc_core.config import Config
    from rediacc_core.grants.records import Grant, write_grants
    from rediacc_core.repos import RepoStore

    assert rdc("machine", "add", "box", "--root", str(fake_machine.root)).exit_code == 0
    assert rdc("repo", "create", "a@box").exit_code == 0
    machine = Config.load().machine("box")
    repo = RepoStore(machine).get_by_label("a")
    machine.grants_path.parent.mkdir(parents=True, exist_ok=True)
    ended = Grant(repo.id, "vendor.example/gpu=0", False, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    write_grants(machine, [ended])

    listed = rdc("repo", "gpu", "list", "a@box")

    assert listed.exit_code == 0, listed.output
    assert "The lease of vendor.example/gpu=0 to a@box ended at 2026-01-02T00:00:00Z; grant it anew: " in (
        listed.stderr
    )
    assert "rdc repo gpu grant a@box --device vendor.example/gpu=0 --for 8h" in listed.stderr


def test_machine_gpu_list_names_an_ended_lease(
    vendor: FakeVendor, rdc_config: Path, fake_machine: FakeMachine
) -> None:
    from rediacc_core.config import Config
    from rediacc_core.grants.records import Grant, write_grants
    from rediacc_core.repos import RepoStore

    assert rdc("machine", "add", "box", "--root", str(fake_machine.root)).exit_code == 0
    assert rdc("machine", "setup", "box").exit_code == 0
    assert rdc("repo", "create", "a@box").exit_code == 0
    machine = Config.load().machine("box")
    repo = RepoStore(machine).get_by_label("a")
    ended = Grant(repo.id, "vendor.example/gpu=0", False, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    write_grants(machine, [ended])

    listed = rdc("machine", "gpu", "list", "box")

    assert listed.exit_code == 0, listed.output
    assert "The lease of vendor.example/gpu=0 to a@box ended at 2026-01-02T00:00:00Z" in listed.stderr
