"""`rdc repo down` leaves no process, containerd-shim or mount of the repo behind (checked in /proc)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv

from rediacc_core import pids
from rediacc_core.runtime.process import read_pid

# The sleep's argument: how this test finds its container's process in /proc. Drawn per run, so that
# another run of this suite on the same host (its own sleep) is never taken for this one's.
TOKEN = str(9_000_000 + secrets.randbelow(1_000_000))


@pytest.fixture
def zeta(e2e: E2E) -> Iterator[RepoEnv]:
    with e2e.extra_repo("zeta") as env:
        yield env


def repo_processes(env: RepoEnv) -> list[str]:
    """Every live process whose command line is the test's sleep or names the repo's directories."""
    marks = (TOKEN.encode(), os.fsencode(env.runtime.daemon_paths.workdir), os.fsencode(env.runtime.data_dir))
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(mark in cmdline for mark in marks) and int(entry) != os.getpid():
            words = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {words}")
    return found


def repo_mounts(env: RepoEnv) -> list[str]:
    dirs = (str(env.runtime.daemon_paths.workdir), str(env.runtime.data_dir))
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return [line for line in lines if any(d in line.split(" ")[4] for d in dirs)]


def start_sleeper(env: RepoEnv) -> None:
    run = env.docker("run", "-d", "--restart", "always", "--name", "sleeper", IMAGE, "sleep", TOKEN)
    assert run.returncode == 0, run.stderr
    assert any(TOKEN in p for p in repo_processes(env))
    assert any("containerd-shim" in p for p in repo_processes(env))
    assert repo_mounts(env)  # the container's rootfs


def test_down_leaves_no_process_shim_or_mount_of_a_restart_always_container(e2e: E2E, zeta: RepoEnv) -> None:
    start_sleeper(zeta)
    down = e2e.rdc("repo", "down", zeta.repo.ref)
    assert down.returncode == 0, down.stderr
    assert repo_processes(zeta) == []
    assert repo_mounts(zeta) == []


def test_down_after_the_daemon_died_kills_what_it_left_and_says_so(e2e: E2E, zeta: RepoEnv) -> None:
    start_sleeper(zeta)
    pid = read_pid(zeta.runtime.daemon_paths.pidfile)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # a daemon that never got to stop its containers
    deadline = time.monotonic() + 10
    while pids.pid_alive(pid):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert any(TOKEN in p for p in repo_processes(zeta))  # containerd, the shim and the sleep live on
    down = e2e.rdc("repo", "down", zeta.repo.ref)
    assert down.returncode == 0, down.stderr
    assert "Killed sleep" in down.stderr and "Killed containerd-shim-runc-v2" in down.stderr
    assert "Unmounted " in down.stderr
    assert repo_processes(zeta) == []
    assert repo_mounts(zeta) == []


def _cgroup_volume_options() -> list[list[str]]:
    """`docker volume create` options mounting each cgroup hierarchy this host has (v1), or the v2 tree."""
    hierarchies = [line.split(":")[1] for line in Path("/proc/self/cgroup").read_text().splitlines()]
    v1 = [names for names in hierarchies if names]
    if not v1:
        return [["--opt", "type=cgroup2", "--opt", "device=cgroup2"]]
    options = []
    for names in v1:
        what = names.replace("name=", "none,name=") if names.startswith("name=") else names
        options.append(["--opt", "type=cgroup", "--opt", "device=cgroup", "--opt", f"o={what}"])
    return options


def test_down_kills_a_process_that_escaped_its_container_cgroup_in_the_host_pid_namespace(
    e2e: E2E, zeta: RepoEnv
) -> None:
    # Issue 10's case, played straight against the daemon (as if a request had got past the gate):
    # a process in the host's pid namespace moves itself out of its container's cgroups, so
    # stopping the daemon leaves it running, with its shim and the repo's mounts.
    direct = RepoEnv(zeta.repo, zeta.runtime, {**zeta.env, "DOCKER_HOST": f"unix://{zeta.daemon}"})
    volumes = []
    for n, options in enumerate(_cgroup_volume_options()):
        created = direct.docker("volume", "create", "--driver", "local", *options, f"cg{n}")
        assert created.returncode == 0, created.stderr
        volumes += ["-v", f"cg{n}:/cg{n}"]
    escape = f"sleep {TOKEN} & P=$!; for d in /cg*; do echo $P > $d/cgroup.procs; done; wait"
    run = direct.docker("run", "-d", "--pid", "host", *volumes, IMAGE, "sh", "-c", escape)
    assert run.returncode == 0, run.stderr
    deadline = time.monotonic() + 10
    while not any(TOKEN in p for p in repo_processes(zeta)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    down = e2e.rdc("repo", "down", zeta.repo.ref)
    assert down.returncode == 0, down.stderr
    assert "Killed sleep" in down.stderr
    assert repo_processes(zeta) == []
    assert repo_mounts(zeta) == []
