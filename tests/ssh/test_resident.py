"""The resident agent: a warm command skips the agent's start-up, and is still checked as before.

The first forwarded command starts a resident `rdc-agent --resident` beside itself; the client's
SSH master forwards a local socket to it, and later commands are served by a child it forks. These
tests prove it by its effects: with the one-shot agent made unrunnable, a warm command still works.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from ssh_kit import BIN, Fleet, install_agent

from rediacc_core.errors import EXIT_STATE, EXIT_TOOL
from rediacc_core.grants.records import read_grants
from rediacc_core.remote import resident
from rediacc_core.remote.address import SshAddress
from rediacc_core.remote.link import local_socket
from rediacc_core.remote.ssh import SshMachine
from rediacc_core.repos import RepoStore
from rediacc_core.statelock import lock_path, state_lock

DEVICE = "nvidia.com/gpu=0"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def wait_for(condition: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still not {condition.__doc__ or condition}")
        time.sleep(0.05)


def server_pid(root: Path) -> int | None:
    """The pid of the resident serving `root`, once it listens."""
    path = resident.socket_path(str(root))
    assert path is not None
    pid = resident.running(str(root))
    return pid if pid is not None and path.exists() else None


@pytest.fixture(autouse=True)
def no_resident(fleet: Fleet) -> Iterator[None]:
    """Each test starts with no resident for the fleet's machines, and leaves none."""

    def none_left() -> None:
        for fm in fleet.machines.values():
            resident.stop(str(fm.root))
        wait_for(lambda: all(server_pid(fm.root) is None for fm in fleet.machines.values()))

    none_left()
    yield
    none_left()


def warm(fleet: Fleet, name: str) -> int:
    """Run a command so the machine's resident starts and the client's forward to it is set up."""
    ok(fleet.client.rdc("repo", "list", name))
    root = fleet.machines[name].root
    wait_for(lambda: server_pid(root) is not None)
    return server_pid(root) or 0


class unrunnable_agent:
    """The one-shot agent made to fail as soon as ssh runs it: only the resident can answer."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.agent = root / "opt/rediacc/bin/rdc-agent"

    def __enter__(self) -> None:
        self.agent.unlink()
        self.agent.write_text("#!/bin/sh\necho 'the one-shot agent ran' >&2\nexit 99\n")
        self.agent.chmod(0o755)

    def __exit__(self, *_exc: object) -> None:
        self.agent.unlink()
        install_agent(self.root)


def test_a_warm_command_is_served_by_the_resident_without_the_one_shot_agent(fleet: Fleet) -> None:
    rdc, root = fleet.client.rdc, fleet.machines["m1"].root
    pid = warm(fleet, "m1")
    with unrunnable_agent(root):
        for _ in range(3):
            listing = rdc("repo", "list", "m1", "-o", "json")
            assert listing.returncode == 0, listing.stderr
            assert isinstance(json.loads(listing.stdout), list)
        created = rdc("repo", "create", "warm@m1")  # a change, under the machine's lock, as before
        assert created.returncode == 0, created.stderr
    assert server_pid(root) == pid  # one resident served them all
    assert RepoStore(fleet.machines["m1"].machine).get_by_label("warm") is not None
    ok(rdc("repo", "delete", "warm@m1", "--yes"))


def test_the_resident_answers_exactly_as_the_one_shot_agent(fleet: Fleet) -> None:
    rdc = fleet.client.rdc
    cases = [
        ("machine", "gpu", "list", "m2", "-o", "json"),
        ("repo", "list", "m2"),
        ("repo", "gpu", "list", "missing@m2"),  # an error: its exit code and both lines
        ("repo", "gpu", "grant", "missing@m2", "--device", "nvidia.com/gpu=typo"),
    ]
    fleet.client.env["RDC_AGENT_IDLE"] = "0"  # resident agents off: the one-shot way each time
    cold = [rdc(*args) for args in cases]
    fleet.client.env["RDC_AGENT_IDLE"] = "20"
    warm(fleet, "m2")
    with unrunnable_agent(fleet.machines["m2"].root):
        hot = [rdc(*args) for args in cases]
    for args, a, b in zip(cases, cold, hot, strict=True):
        assert (b.returncode, b.stdout, b.stderr) == (a.returncode, a.stdout, a.stderr), args


def test_an_idle_resident_stops_and_the_next_command_starts_one_again(fleet: Fleet) -> None:
    root = fleet.machines["m1"].root
    fleet.client.env["RDC_AGENT_IDLE"] = "1"
    first = warm(fleet, "m1")
    path = resident.socket_path(str(root))
    assert path is not None
    wait_for(lambda: server_pid(root) is None, timeout=15)
    assert not path.exists()  # it removed its socket
    wait_for(lambda: not _alive(first), timeout=10)
    ok(fleet.client.rdc("repo", "list", "m1"))  # through the one-shot agent, which starts a new one
    wait_for(lambda: server_pid(root) not in (None, first))


def install_marker(site: Path, version: str) -> None:
    """A rediacc plugin distribution of `version` in the agent's site-packages, as pip leaves one (in
    the `rediacc.demo` group, which no command loads): the client, reading the same install, and every
    agent report it among their versions, and the agent serves only a client of the same versions."""
    for old in site.glob("rdc_resident_marker-*.dist-info"):
        shutil.rmtree(old)
    info = site / f"rdc_resident_marker-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: rdc-resident-marker\nVersion: {version}\n")
    (info / "entry_points.txt").write_text("[rediacc.demo]\nmarker = rdc_resident_marker:layout\n")


def test_a_new_install_restarts_a_warm_resident_before_it_serves_old_code(
    fleet: Fleet, tmp_path: Path
) -> None:
    """`rdc machine install` (or pip) replaces the distributions; a warm resident holds the old code
    in memory, so it answers no more commands and the next one runs the new install. The proof is the
    version the serving agent reports: a resident still holding 1.0 would refuse the client of 2.0."""
    root = fleet.machines["m1"].root
    core = _agent_python("import importlib.metadata as m; print(m.distribution('rediacc-core')._path)")
    site = Path(core).parent
    fleet.client.env["RDC_AGENT_IDLE"] = "600"  # the new resident waits out a slow second client
    try:
        install_marker(site, "1.0")
        old = warm(fleet, "m1")
        install_marker(site, "2.0")  # the reinstall
        ok(fleet.client.rdc("repo", "list", "m1"))
        wait_for(lambda: server_pid(root) not in (None, old))
        new = server_pid(root)
        # A second laptop, forwarding to the new resident once it has run one command (the first
        # client's master does not reach a restarted resident: its commands run the one-shot way).
        # With the one-shot agent unrunnable, only a resident of 2.0 can serve it.
        other = fleet.new_client(tmp_path / "other")
        other.env["RDC_AGENT_IDLE"] = "600"
        assert fleet.add(other, "m1", "--accept-host-key").returncode == 0
        ok(other.rdc("repo", "list", "m1"))
        with unrunnable_agent(root):
            ok(other.rdc("repo", "list", "m1"))
        assert server_pid(root) == new
    finally:
        for marker in site.glob("rdc_resident_marker-*.dist-info"):
            shutil.rmtree(marker)


def test_a_client_of_other_versions_is_told_the_skew_by_a_warm_resident(fleet: Fleet, tmp_path: Path) -> None:
    warm(fleet, "m1")
    extra = tmp_path / "site" / "rdc_skew_plugin-9.9.dist-info"
    extra.mkdir(parents=True)
    (extra / "METADATA").write_text("Metadata-Version: 2.1\nName: rdc-skew-plugin\nVersion: 9.9\n")
    (extra / "entry_points.txt").write_text("[rediacc.demo]\nskew = rdc_skew_plugin:layout\n")
    fleet.client.env["PYTHONPATH"] = str(extra.parent)
    with unrunnable_agent(fleet.machines["m1"].root):
        refused = fleet.client.rdc("repo", "list", "m1")
    assert refused.returncode == EXIT_STATE, refused.stderr
    assert "rdc-skew-plugin 9.9 here, absent on the machine" in refused.stderr
    assert "rdc machine install m1" in refused.stderr


def test_a_command_killed_mid_way_leaves_the_whole_change_or_none(fleet: Fleet) -> None:
    rdc, machine = fleet.client.rdc, fleet.machines["m1"].machine
    ok(rdc("machine", "setup", "m1"))
    ok(rdc("repo", "create", "killed@m1"))
    server = warm(fleet, "m1")
    with state_lock(machine):
        # The grant waits for the lock we hold in the resident's child; that child is killed.
        waiting = fleet.client.popen("repo", "gpu", "grant", "killed@m1", "--device", DEVICE)
        wait_for(lambda: _waiting_on(lock_path(machine), _children(server)))
        for child in _children(server):
            os.kill(child, signal.SIGKILL)
        _out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == EXIT_TOOL, err
    assert "ended before the command finished" in err and "whole change or none" in err
    repo = RepoStore(machine).get_by_label("killed")
    assert repo is not None
    assert [g for g in read_grants(machine) if g.repo_id == repo.id] == []  # none of it
    assert server_pid(fleet.machines["m1"].root) == server  # the resident serves on
    ok(rdc("repo", "gpu", "grant", "killed@m1", "--device", DEVICE))  # and the rerun is whole
    ok(rdc("repo", "delete", "killed@m1", "--yes"))


def _waiting_on(lock: Path, pids: list[int], since: dict[int, float] = {}) -> bool:  # noqa: B006
    """Whether one of `pids` is waiting for `lock`: seen with it open, or running for 3 s (a waiter
    opens the file only for each try, so seeing it is luck; 3 s is well inside its 10 s wait)."""
    for pid in pids:
        started = since.setdefault(pid, time.monotonic())
        try:
            if any(os.readlink(fd) == str(lock) for fd in Path(f"/proc/{pid}/fd").iterdir()):
                return True
        except OSError:
            continue
        if time.monotonic() - started > 3:
            return True
    return False


def _agent_python(code: str) -> str:
    """What the agent's interpreter prints for `code`, run as the agent runs (not from this tree)."""
    found = subprocess.run(
        [str(BIN / "python"), "-c", code], cwd="/", capture_output=True, text=True, check=True
    )
    return found.stdout.strip()


def _alive(pid: int) -> bool:
    """Running, not gone nor a zombie waiting for whoever adopted it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "stat").read_text().rsplit(")", 1)[1].split()[1] == str(pid):
                found.append(int(proc.name))
        except (OSError, IndexError):
            continue
    return found


def test_the_resident_serves_only_its_own_user(fleet: Fleet) -> None:
    """Another uid connecting to the socket is dropped before a byte is read."""
    root = fleet.machines["m1"].root
    warm(fleet, "m1")
    path = resident.socket_path(str(root))
    assert path is not None and path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700
    # Opened as root, then entered as nobody through /proc (the path above it stays private).
    probe = (
        "import ctypes,os,socket,sys\n"
        "fd = os.open(sys.argv[1], os.O_PATH)\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self stays ours\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(f'/proc/self/fd/{fd}/{sys.argv[2]}')\n"
        "try:\n"
        "    s.sendall(b'{}\\n'); print(repr(s.recv(100)))\n"
        "except (BrokenPipeError, ConnectionResetError):  # dropped before or after the send\n"
        "    print(repr(b''))\n"
    )
    os.chmod(path.parent, 0o711)
    os.chmod(path, 0o666)
    try:
        seen = subprocess.run(
            ["python3", "-c", probe, str(path.parent), path.name], capture_output=True, text=True, timeout=30
        )
    finally:
        os.chmod(path, 0o600)
        os.chmod(path.parent, 0o700)
    assert seen.stdout.strip() == "b''", seen.stderr


def test_the_forward_is_named_for_the_master_and_root_it_leads_to(fleet: Fleet) -> None:
    ssh = SshMachine("m1", SshAddress.parse(fleet.sshd.address), fleet.client.known_hosts)
    here = local_socket(ssh, "/a")
    assert local_socket(ssh, "/b") != here
    other = SshMachine(
        "m1", SshAddress.parse(fleet.sshd.address.replace("root@", "nobody@")), ssh.known_hosts
    )
    assert local_socket(other, "/a") != here
