"""Fleet correctness: what the user gives is kept as they meant it, and ssh's failures are told as
what they are (tests/ssh does the same against a real sshd)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from rediacc_core.cli import cli
from rediacc_core.cli.output import waiting
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_REFUSED, EXIT_TOOL, RdcError, StateError
from rediacc_core.machine import Machine
from rediacc_core.remote import agent, install, protocol, ssh
from rediacc_core.remote.address import SshAddress
from rediacc_core.remote.agentcall import AgentCall
from rediacc_core.remote.ssh import SshMachine, classify, try_command

ADDRESS = SshAddress.parse("root@127.0.0.1:35277", "/keys/id_far1")


def far1(tmp_path: Path) -> SshMachine:
    return SshMachine("far1", ADDRESS, tmp_path / "known_hosts")


def outcome(tmp_path: Path, returncode: int, stderr: str) -> RdcError:
    machine = Machine("far1", Path("/"), remote=ADDRESS)
    call = AgentCall(machine, far1(tmp_path), protocol.request("run"))
    with pytest.raises(RdcError) as caught:
        call._outcome(returncode, stderr)
    return caught.value


def test_a_relative_identity_is_stored_absolute(
    rdc_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = Config.load()
    config.add_ssh("far1", SshAddress.parse("root@far1", "keys/id_far1"))
    config.add_ssh("far2", SshAddress.parse("root@far2", "~/id_far2"))
    config.save()
    monkeypatch.chdir("/")
    loaded = Config.load()
    assert loaded.machine("far1").remote == SshAddress("far1", "root", None, str(tmp_path / "keys/id_far1"))
    assert loaded.machine("far2").remote == SshAddress("far2", "root", None, os.path.expanduser("~/id_far2"))


def test_a_missing_key_file_is_said_as_such_never_as_a_missing_agent(tmp_path: Path) -> None:
    error = outcome(
        tmp_path,
        255,
        "Warning: Identity file keys/id_far1 not accessible: No such file or directory.\n"
        "root@127.0.0.1: Permission denied (publickey).\n",
    )
    assert not isinstance(error, StateError) and error.exit_code == EXIT_TOOL
    assert "key file of machine far1, keys/id_far1, does not exist" in error.what
    assert "not installed" not in error.what


def test_a_refused_login_and_an_unknown_host_are_what_they_are(tmp_path: Path) -> None:
    refused = outcome(tmp_path, 255, "root@127.0.0.1: Permission denied (publickey).\n")
    assert "refused the login" in refused.what and "ssh -p 35277" in refused.todo
    unknown = outcome(tmp_path, 255, "ssh: Could not resolve hostname far9: Name or service not known\n")
    assert "is not known here" in unknown.what and unknown.exit_code == EXIT_TOOL


def test_only_the_machines_shell_finding_no_agent_means_rdc_is_not_installed(tmp_path: Path) -> None:
    error = outcome(tmp_path, 127, "sh: 1: exec: /opt/rediacc/bin/rdc-agent: not found\n")
    assert isinstance(error, StateError) and "rdc is not installed on machine far1" in error.what
    # A command that ran and lost its connection mentioning a missing file is not a missing agent.
    dropped = outcome(tmp_path, 1, "cat: /nowhere: No such file or directory\n")
    assert "not installed" not in dropped.what


def test_the_cannot_reach_advice_is_an_ssh_line_that_runs(tmp_path: Path) -> None:
    assert try_command(far1(tmp_path)) == "ssh -p 35277 -i /keys/id_far1 root@127.0.0.1 true"
    error = classify(far1(tmp_path), 255, "ssh: connect to host 127.0.0.1 port 35277: Connection refused")
    assert error.todo.endswith("ssh -p 35277 -i /keys/id_far1 root@127.0.0.1 true")
    bare = SshMachine("lab", SshAddress.parse("lab"), tmp_path / "known_hosts")
    assert try_command(bare) == "ssh lab true"


def _keys(monkeypatch: pytest.MonkeyPatch, trusted: list[str], presented: list[str]) -> None:
    monkeypatch.setattr(SshMachine, "trusted_keys", lambda _s: trusted)
    monkeypatch.setattr(SshMachine, "scan_keys", lambda _s: presented)
    monkeypatch.setattr(SshMachine, "close_master", lambda _s: None)
    monkeypatch.setattr(
        ssh, "fingerprints", lambda lines: [f"SHA256:{line.split()[-1]} (ED25519)" for line in lines]
    )


def test_a_changed_host_key_error_shows_the_old_and_the_new_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys(monkeypatch, ["rdc.far1 ssh-ed25519 OLD"], ["rdc.far1 ssh-ed25519 NEW"])
    error = classify(far1(tmp_path), 255, "@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@")
    assert "Trusted: SHA256:OLD (ED25519); presented now: SHA256:NEW (ED25519)" in error.what
    assert "rdc machine trust far1 --fingerprint SHA256:" in error.todo


@pytest.fixture
def changed_far1(rdc_config: Path, monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    config = Config.load()
    config.add_ssh("far1", ADDRESS)
    config.save()
    remembered: list[list[str]] = []
    _keys(monkeypatch, ["rdc.far1 ssh-ed25519 OLD"], ["rdc.far1 ssh-ed25519 NEW"])
    monkeypatch.setattr("rediacc_core.cli.machine_ssh.fingerprints", ssh.fingerprints)
    monkeypatch.setattr(SshMachine, "remember_keys", lambda _s, lines: remembered.append(list(lines)))
    return remembered


def test_a_changed_host_key_is_not_replaced_by_a_bare_trust(changed_far1: list[list[str]]) -> None:
    result = CliRunner().invoke(cli, ["machine", "trust", "far1"])
    assert result.exit_code == EXIT_REFUSED and changed_far1 == []
    assert "trusted SHA256:OLD (ED25519), presented now SHA256:NEW (ED25519)" in result.output
    assert "rdc machine trust far1 --fingerprint SHA256:NEW" in result.output


def test_a_changed_host_key_is_replaced_with_its_fingerprint(changed_far1: list[list[str]]) -> None:
    result = CliRunner().invoke(cli, ["machine", "trust", "far1", "--fingerprint", "SHA256:NEW"])
    assert result.exit_code == 0, result.output
    assert changed_far1 == [["rdc.far1 ssh-ed25519 NEW"]]
    assert "Replaced the old host key of far1 (SHA256:OLD (ED25519))" in result.output


def test_a_changed_host_key_is_replaced_by_a_yes_typed_on_a_terminal(
    changed_far1: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("rediacc_core.cli.machine_ssh.on_terminal", lambda: True)
    assert CliRunner().invoke(cli, ["machine", "trust", "far1"], input="no\n").exit_code == EXIT_REFUSED
    result = CliRunner().invoke(cli, ["machine", "trust", "far1"], input="yes\n")
    assert result.exit_code == 0, result.output
    assert changed_far1 == [["rdc.far1 ssh-ed25519 NEW"]]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_long_steps_say_nothing_off_a_terminal_and_count_seconds_on_one() -> None:
    off = io.StringIO()
    with waiting("Stopping repo a@m", off, only_terminal=True):
        pass
    assert off.getvalue() == ""
    on = _Tty()
    with waiting("Stopping repo a@m", on, interval=0.01, only_terminal=True):
        pass
    assert "Stopping repo a@m … waited 0s" in on.getvalue()


def test_the_agent_shows_the_clients_terminal_to_the_command() -> None:
    sender = protocol.Sender(io.BytesIO())
    assert agent._Chunks(sender, "err", tty=True).isatty() is True
    assert agent._Chunks(sender, "err").isatty() is False


# --- machine install: quick when nothing changed -----------------------------------------------------


class _Dist:
    def __init__(self, source: Path) -> None:
        self.version = "0.1.0"
        self.source = source

    def read_text(self, name: str) -> str | None:
        if name == "direct_url.json":
            return f'{{"url": "file://{self.source}", "dir_info": {{"editable": true}}}}'
        return None


def test_a_checkouts_fingerprint_changes_with_its_code_not_with_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "src"
    (source / "pkg" / "__pycache__").mkdir(parents=True)
    (source / "pkg" / "mod.py").write_text("A = 1\n")
    monkeypatch.setattr("importlib.metadata.distribution", lambda _name: _Dist(source))
    first = install.fingerprints(["pkg"])
    (source / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"cache")
    (source / "pkg.egg-info").mkdir()
    (source / ".git").mkdir()
    (source / ".git" / "index").write_bytes(b"git")
    assert install.fingerprints(["pkg"]) == first
    (source / "pkg" / "mod.py").write_text("A = 2\n")
    assert install.fingerprints(["pkg"]) != first
    assert first["pkg"].startswith("0.1.0 sha256:")


def test_the_install_script_records_the_fingerprints_last() -> None:
    script = install.install_script(
        "/opt/rediacc", {"rediacc-core": "0.1.0"}, {"rediacc-core": "0.1.0 sha256:ab"}
    )
    lines = script.splitlines()
    assert "installed.json" in lines[-1] and "sha256:ab" in lines[-1]
