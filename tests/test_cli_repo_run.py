"""`rdc repo docker-host | down | units | gate log`: what needs no running daemon (the rest: tests/e2e)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from signals_kit import ctrl_c_reaches_it

from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_NOT_FOUND, EXIT_STATE, EXIT_VALIDATION
from rediacc_core.gate.audit.log import Audit, append_event
from rediacc_core.gate.audit.peer import Peer
from rediacc_core.gate.policy.rules import GUARD_RUNTIME
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.runtime import containerd, layout, netns
from rediacc_core.runtime.layout import DaemonPaths
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
    assert result.stdout == f"unix://{layout.runtime_for(box, repo).gate_socket}\n"


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


def test_units_advise_enabling_only_once_the_templates_are_installed(box: Machine) -> None:
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    missing = rdc("repo", "units", "alpha@box")
    assert missing.exit_code == 0, missing.output
    advice = "The unit templates are not installed: sudo rdc repo units alpha@box --install "
    assert advice + str(box.path("/etc/systemd/system")) in missing.stderr
    installed = rdc("repo", "units", "alpha@box", "--install", str(box.path("/etc/systemd/system")))
    assert installed.exit_code == 0, installed.output
    again = rdc("repo", "units", "alpha@box")
    assert "Enable them with: systemctl enable --now rediacc-repo-dockerd@alpha@box.service" in again.stderr


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


def _audited(box: Machine) -> Path:
    """Repo alpha with three decisions in its audit log: one an hour ago, two now."""
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    repo = RepoStore(box).get_by_label("alpha")
    path = layout.runtime_for(box, repo).audit_log
    log = Audit(path, repo.id, repo.name)
    log.record(Peer(7, 0, 0), "POST", "/v1.45/containers/create", status=200, endpoint="container-create")
    log.record(
        Peer(4242, 1000, 1000), "POST", "/v1.45/containers/create", status=403, endpoint="container-create",
        rules=("grant",), cdi_asked=("vendor.example/gpu=1",), message="no grant",
    )  # fmt: skip
    lines = path.read_text().splitlines()
    old = json.loads(lines[0])
    old["time"] = "2020-01-01T00:00:00.000Z"
    path.write_text("\n".join([json.dumps(old), *lines]) + "\n")
    return path


def test_gate_log_prints_each_decision_with_the_client_credentials(box: Machine) -> None:
    _audited(box)
    result = rdc("repo", "gate", "log", "alpha@box")
    assert result.exit_code == 0, result.output
    header, *rows = result.stdout.splitlines()
    assert header.split() == ["TIME", "PEER", "REQUEST", "DECISION", "RULES", "CDI"]
    assert len(rows) == 3
    assert "pid 4242 uid 1000" in rows[2] and "refused 403" in rows[2] and "grant" in rows[2]
    assert "vendor.example/gpu=1 (refused)" in rows[2]


def test_gate_log_is_one_table_fitted_to_the_terminal(box: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    from rediacc_core.cli import repo_run
    from rediacc_core.cli.output import table

    _audited(box)
    # As on an 80-column terminal (`fitted` gives `table` the terminal's width there).
    monkeypatch.setattr(repo_run, "table", lambda headers, rows: table(headers, rows, width=80))
    lines = rdc("repo", "gate", "log", "alpha@box").stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert lines[0].split() == ["TIME", "PEER", "REQUEST", "DECISION", "RULES", "CDI"]
    assert "vendor.example/gpu=1" in "\n".join(lines)  # a CDI name is never cut


def test_a_handover_reads_as_what_rdc_did_not_as_a_refusal(box: Machine) -> None:
    path = _audited(box)
    repo = RepoStore(box).get_by_label("alpha")
    append_event(
        path, {"id": repo.id, "name": repo.name}, endpoint="gpu-handover", decision="handover",
        cdi=["vendor.example/gpu=0"], message="vendor.example/gpu=0 granted exclusively to beta@box",
    )  # fmt: skip
    row = rdc("repo", "gate", "log", "alpha@box").stdout.splitlines()[-1]
    assert "gpu-handover" in row and "handover" in row
    assert row.rstrip().endswith("vendor.example/gpu=0") and "(refused)" not in row
    assert f"pid {os.getpid()} uid {os.getuid()}" in row, "the rdc command that did it"


def test_gate_log_since_and_json_give_the_recent_entries_as_json_lines(box: Machine) -> None:
    _audited(box)
    result = rdc("repo", "gate", "log", "alpha@box", "--since", "1h", "-o", "json")
    assert result.exit_code == 0, result.output
    found = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["decision"], e["peer"]["pid"]) for e in found] == [("admitted", 7), ("refused", 4242)]


def test_gate_log_refuses_a_since_it_cannot_read(box: Machine) -> None:
    _audited(box)
    result = rdc("repo", "gate", "log", "alpha@box", "--since", "yesterday")
    assert result.exit_code == EXIT_VALIDATION
    assert "--since 'yesterday'" in result.stderr and "15m" in result.stderr


def test_gate_log_of_a_gate_that_decided_nothing_says_so(box: Machine) -> None:
    assert rdc("repo", "create", "alpha@box").exit_code == 0
    result = rdc("repo", "gate", "log", "alpha@box")
    assert result.exit_code == 0 and result.stdout == ""
    assert "no audit log yet" in result.stderr


def test_gate_with_a_repo_and_no_subcommand_still_runs_the_gate(box: Machine) -> None:
    result = rdc("repo", "gate", "nosuch@box")  # what systemd units written before `gate run` say
    assert result.exit_code == EXIT_NOT_FOUND
    assert "nosuch" in result.stderr
    listed = rdc("repo", "gate", "--help")
    assert "log" in listed.stdout and "run" in listed.stdout


def test_gate_log_piped_into_head_ends_quietly(box: Machine) -> None:
    path = _audited(box)
    repo = RepoStore(box).get_by_label("alpha")
    log = Audit(path, repo.id, repo.name)
    for n in range(2000):  # more than a pipe holds: the writer meets the closed pipe
        log.record(Peer(n, 0, 0), "POST", "/v1.45/containers/create", status=200)
    shown = subprocess.run(
        f"{sys.executable} -m rediacc_core.cli repo gate log alpha@box | head -1",
        shell=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0 and shown.stdout.startswith("TIME")
    assert shown.stderr == ""


def test_the_dockerd_unit_runs_the_daemon_under_the_runtime_guard(
    box: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a reboot systemd starts the daemon: it must apply restart policies under the guard too."""
    ran: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda program, argv: ran.append(list(argv)))
    networks: list[layout.RepoNetwork] = []  # made for real by the unit; here only recorded
    monkeypatch.setattr(netns, "bring_up", lambda net, root, sock: networks.append(net))
    started: list[DaemonPaths] = []  # its own containerd first, recorded here

    def record(paths: DaemonPaths, network: layout.RepoNetwork) -> int:
        started.append(paths)
        return 1

    monkeypatch.setattr(containerd, "start_containerd", record)
    created = rdc("repo", "create", "gamma@box")
    assert created.exit_code == 0, created.stderr
    assert rdc("repo", "dockerd", "gamma@box").exit_code == 0
    (argv,) = ran
    (paths,) = started
    (network,) = networks
    assert argv[:2] == [argv[0], f"--net={network.path}"]  # dockerd runs inside the repo's namespace
    config = json.loads(Path(argv[argv.index("--config-file") + 1]).read_text())
    assert config["containerd"] == str(paths.containerd_socket)  # never the host's containerd
    assert config["default-runtime"] == GUARD_RUNTIME
    guard_script = Path(config["runtimes"][GUARD_RUNTIME]["path"])
    assert "--repo-ref gamma@box" in guard_script.read_text()


def test_gate_log_follow_ends_quietly_on_ctrl_c(box: Machine) -> None:
    _audited(box)
    follow = subprocess.Popen(
        [sys.executable, "-m", "rediacc_core.cli", "repo", "gate", "log", "alpha@box", "--follow"],
        preexec_fn=ctrl_c_reaches_it,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    deadline = time.monotonic() + 30
    lines: list[str] = []
    while len(lines) < 4 and time.monotonic() < deadline:  # the header and the three decisions
        lines.append(follow.stdout.readline())
    follow.send_signal(signal.SIGINT)
    _, err = follow.communicate(timeout=30)
    assert len(lines) == 4 and "refused 403" in lines[3]
    assert follow.returncode == 130
    assert err == "", "Ctrl-C is how --follow ends: nothing to report"
