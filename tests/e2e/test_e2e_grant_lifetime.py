"""A grant holds over a container's whole life, on the real Docker Engine: once revoked, no container
of the repo runs with the device again, whoever starts it (the docker CLI through the gate, the
daemon's own socket, a restart policy, the daemon coming back after SIGKILL or `rdc repo down`/`up`);
revoke names the holders and stops them; exclusive means no running holder elsewhere.

Each effect is checked where it matters: the device node inside the container, or the container
never running at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_kit import E2E, FAKEGPU0, GPU0, IMAGE, RepoEnv, refused, wait_for

from rediacc_core import pids
from rediacc_core.grants.records import Grant, delete_repo, read_grants
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.runtime.holdings import device_openers
from rediacc_core.runtime.process import read_pid
from rediacc_core.testing.dockerenv import docker_api, import_busybox

JSON = "application/json"
NOT_GRANTED = f"holds {GPU0}, which repo alpha has no grant for now"


def state(repo: RepoEnv, name: str) -> dict[str, Any]:
    status, inspected = repo.daemon_api("GET", f"/containers/{name}/json")
    assert status == 200, inspected
    found: dict[str, Any] = inspected["State"]
    return found


@pytest.fixture
def holder(e2e: E2E) -> Iterator[str]:
    """A container of alpha created with GPU0 while granted, then the grant revoked."""
    e2e.grant(e2e.alpha, GPU0)
    name = f"holder-{os.getpid()}-{time.monotonic_ns()}"
    created = e2e.alpha.docker("create", "--name", name, "--device", GPU0, IMAGE, "sleep", "300")
    assert created.returncode == 0, created.stderr
    yield name
    e2e.alpha.docker("rm", "-f", name)
    e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0)


def revoke(e2e: E2E, *extra: str) -> subprocess.CompletedProcess[str]:
    return e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0, *extra)


def test_a_container_created_while_granted_does_not_start_after_the_revoke(e2e: E2E, holder: str) -> None:
    revoke(e2e)
    refused(e2e.alpha.docker("start", "-a", holder), NOT_GRANTED, "docker rm", "rdc repo gpu grant")
    assert state(e2e.alpha, holder)["Running"] is False


def test_the_daemon_asked_directly_cannot_start_it_either(e2e: E2E, holder: str) -> None:
    """The runtime guard refuses below the gate: what a restart policy or the daemon itself would do."""
    revoke(e2e)
    status, body = e2e.alpha.daemon_api("POST", f"/containers/{holder}/start")
    assert status >= 400
    assert "rdc: repo alpha@m1 may not run this container" in body["message"]
    assert f"({GPU0})" in body["message"]
    assert state(e2e.alpha, holder)["Running"] is False
    lines = e2e.alpha.runtime.guard_log.read_text().splitlines()
    assert any(json.loads(line)["runc"] == "create" for line in lines)


def test_regranted_it_starts_again_with_the_device(e2e: E2E, holder: str) -> None:
    revoke(e2e)
    e2e.grant(e2e.alpha, GPU0)
    started = e2e.alpha.docker("start", holder)
    assert started.returncode == 0, started.stderr
    seen = e2e.alpha.docker("exec", holder, "ls", "/dev/fakegpu0")
    assert seen.returncode == 0 and "/dev/fakegpu0" in seen.stdout


def test_restart_exec_and_unpause_of_a_running_holder_are_refused(e2e: E2E, holder: str) -> None:
    assert e2e.alpha.docker("start", holder).returncode == 0
    status, made = e2e.alpha.daemon_api("POST", f"/containers/{holder}/exec", b'{"Cmd":["ls","/dev"]}')
    assert status == 201
    assert e2e.alpha.docker("pause", holder).returncode == 0
    revoke(e2e)
    refused(e2e.alpha.docker("unpause", holder), NOT_GRANTED)
    assert state(e2e.alpha, holder)["Paused"] is True
    # Unpaused on the daemon's own socket, the guard refuses the resume.
    status, body = e2e.alpha.daemon_api("POST", f"/containers/{holder}/unpause")
    assert status >= 400 and "rdc: repo alpha@m1" in body["message"]
    assert state(e2e.alpha, holder)["Paused"] is True
    e2e.grant(e2e.alpha, GPU0)
    assert e2e.alpha.docker("unpause", holder).returncode == 0
    revoke(e2e)
    refused(e2e.alpha.docker("exec", holder, "ls", "/dev"), NOT_GRANTED)
    # An exec instance made while granted, started after the revoke: refused by the gate ...
    start = f"/v1.45/exec/{made['Id']}/start"
    status, body = docker_api(e2e.alpha.gate, "POST", start, b'{"Detach":false}', Content_Type=JSON)
    assert status == 403 and NOT_GRANTED in body["message"]
    # ... and by the guard when started on the daemon's own socket (the error comes in the stream).
    status, streamed = e2e.alpha.daemon_api("POST", f"/exec/{made['Id']}/start", b'{"Detach":false}')
    assert b"OCI runtime exec failed: rdc: repo alpha@m1 may not run this container" in streamed
    refused(e2e.alpha.docker("restart", holder), NOT_GRANTED)


def test_revoke_names_the_holders_and_its_exit_code_says_they_still_run(e2e: E2E, holder: str) -> None:
    assert e2e.alpha.docker("start", holder).returncode == 0
    done = revoke(e2e, "-o", "json")
    assert done.returncode == 12, done.stderr
    report = json.loads(done.stdout)
    assert [h["container"] for h in report["holders"]] == [holder]
    assert report["holders"][0]["running"] is True and report["holders"][0]["stopped"] is False
    assert f"docker stop {holder}" in done.stderr
    # The open device is still there: a revoke does not reach into a running process.
    assert state(e2e.alpha, holder)["Running"] is True


def test_revoke_with_stop_stops_the_running_holders(e2e: E2E, holder: str) -> None:
    assert e2e.alpha.docker("start", holder).returncode == 0
    done = revoke(e2e, "--stop")
    assert done.returncode == 0, done.stderr
    assert f"Stopped container {holder}" in done.stderr
    assert state(e2e.alpha, holder)["Running"] is False
    refused(e2e.alpha.docker("start", holder), NOT_GRANTED)


def test_an_exclusive_grant_waits_for_the_other_repos_running_holder(e2e: E2E, holder: str) -> None:
    assert e2e.alpha.docker("start", holder).returncode == 0
    assert revoke(e2e).returncode == 12
    beta = e2e.beta.repo.ref
    try:
        blocked = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive")
        assert blocked.returncode == 4, blocked.stderr
        assert f"container {holder} of repo alpha@m1 is running with {GPU0}" in blocked.stderr
        assert "--stop-holders" in blocked.stderr
        assert GPU0 not in e2e.rdc("repo", "gpu", "list", beta).stdout
        moved = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive", "--stop-holders")
        assert moved.returncode == 0, moved.stderr
        assert f"Stopped container {holder} of repo alpha@m1" in moved.stderr
        assert state(e2e.alpha, holder)["Running"] is False
        refused(e2e.alpha.docker("start", holder), NOT_GRANTED)
        ran = e2e.beta.docker("run", "--rm", "--device", GPU0, IMAGE, "ls", "/dev/fakegpu0")
        assert ran.returncode == 0, ran.stderr
        for side in (e2e.alpha, e2e.beta):  # the handover is in both repos' audit trails
            lines = [json.loads(line) for line in side.runtime.audit_log.read_text().splitlines()]
            (handover,) = [e for e in lines if e.get("decision") == "handover" and holder in e["message"]]
            assert (
                handover["cdi_asked"] == [GPU0]
                and "to beta@m1, handed over from alpha@m1" in handover["message"]
            )
    finally:
        e2e.rdc("repo", "gpu", "revoke", beta, "--device", GPU0)


def test_take_over_hands_the_device_over_in_one_step(e2e: E2E, holder: str) -> None:
    """The other repo still holds its grant: --take-over lists it, revokes it there and empties that
    repo. Off a terminal the advice, run as printed, asks for --yes (the line it prints runs too)."""
    assert e2e.alpha.docker("start", holder).returncode == 0
    beta = e2e.beta.repo.ref
    try:
        blocked = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive")
        assert blocked.returncode == 4, blocked.stderr
        advised = f"rdc repo gpu grant {beta} --device {GPU0} --exclusive --take-over"
        assert advised in blocked.stderr
        asked = e2e.rdc(*advised.split()[1:])  # the advice, run as printed, with no terminal to ask on
        assert (
            asked.returncode == 4
            and f"not revoking {GPU0} of repo alpha@m1 without confirmation" in asked.stderr
        )
        assert f"{advised} --yes" in asked.stderr
        moved = e2e.rdc(*advised.split()[1:], "--yes")  # that advice, run as printed
        assert moved.returncode == 0, moved.stderr
        assert f"Took {GPU0} over from alpha@m1: its grant there is revoked." in moved.stderr
        assert f"Stopped container {holder} of repo alpha@m1" in moved.stderr
        assert GPU0 not in e2e.rdc("repo", "gpu", "list", e2e.alpha.repo.ref).stdout
        assert state(e2e.alpha, holder)["Running"] is False
        refused(e2e.alpha.docker("start", holder), NOT_GRANTED)
        ran = e2e.beta.docker("run", "--rm", "--device", GPU0, IMAGE, "ls", "/dev/fakegpu0")
        assert ran.returncode == 0, ran.stderr
        for side in (e2e.alpha, e2e.beta):  # the handover is in both repos' audit trails
            lines = [json.loads(line) for line in side.runtime.audit_log.read_text().splitlines()]
            assert any(
                e.get("decision") == "handover" and holder in e["message"] and "to beta@m1" in e["message"]
                for e in lines
            )
    finally:
        e2e.rdc("repo", "gpu", "revoke", beta, "--device", GPU0)


def test_the_handover_check_finds_a_device_node_held_open(e2e: E2E) -> None:
    """What `--stop-holders` checks after stopping: any process of the old repo with the node open."""
    e2e.grant(e2e.alpha, GPU0)
    name = f"opener-{os.getpid()}"
    try:
        run = e2e.alpha.docker(
            "run",
            "-d",
            "--name",
            name,
            "--device",
            GPU0,
            IMAGE,
            "sh",
            "-c",
            "exec 3</dev/fakegpu0; sleep 300",
        )
        assert run.returncode == 0, run.stderr
        node = [("c", *FAKEGPU0)]
        assert wait_for(lambda: bool(device_openers(e2e.machine, e2e.alpha.repo, node)))
        (found,) = device_openers(e2e.machine, e2e.alpha.repo, node)
        assert found.how == "fd 3 (/dev/fakegpu0)" and found.container is not None
        assert device_openers(e2e.machine, e2e.beta.repo, node) == []  # another repo's: not its
        assert e2e.alpha.docker("stop", "-t", "0", name).returncode == 0
        assert device_openers(e2e.machine, e2e.alpha.repo, node) == []
    finally:
        e2e.alpha.docker("rm", "-f", name)
        revoke(e2e)


def test_a_restart_policy_does_not_bring_a_revoked_device_back(e2e: E2E) -> None:
    e2e.grant(e2e.alpha, GPU0)
    name = f"crashy-{os.getpid()}"
    try:
        # Exits (as a crash would) every second; the daemon restarts it on its own, unseen by the gate.
        run = e2e.alpha.docker(
            "run", "-d", "--name", name, "--restart", "always", "--device", GPU0, IMAGE, "sh", "-c", "sleep 1"
        )
        assert run.returncode == 0, run.stderr
        assert wait_for(lambda: int(state(e2e.alpha, name).get("Pid") or 0) > 0)
        revoke(e2e)
        assert wait_for(lambda: "rdc: repo alpha@m1 may not run" in str(state(e2e.alpha, name)["Error"]))
        time.sleep(2)
        assert state(e2e.alpha, name)["Running"] is False
    finally:
        e2e.alpha.docker("rm", "-f", name)


@pytest.fixture
def gamma(e2e: E2E) -> Iterator[tuple[Repo, RepoEnv]]:
    """A repo of its own, whose daemon the test kills and restarts."""
    repo = RepoStore(e2e.machine).create(f"gamma{os.getpid() % 1000}")
    runtime = lifecycle.repo_up(e2e.machine, repo)
    import_busybox(runtime.upstream_socket, IMAGE)
    env = {**e2e.alpha.env, "DOCKER_HOST": runtime.docker_host_url}
    try:
        yield repo, RepoEnv(repo, runtime, env)
    finally:
        lifecycle.repo_down(e2e.machine, repo)
        delete_repo(e2e.machine, repo)


# What stops a restart-policy start when a repo daemon comes back: the runtime guard, or on Engine
# 26.1 the daemon itself, which restores containers before its CDI driver is registered.
REFUSED_AT_RESTORE = ("rdc: repo", 'could not select device driver "cdi"')


def never_runs_again(env: RepoEnv, name: str) -> None:
    """The daemon tried to start `name` on its own, was refused, and it stays down."""
    assert wait_for(lambda: any(why in str(state(env, name)["Error"]) for why in REFUSED_AT_RESTORE))
    time.sleep(2)  # restart policies back off and try again: still down
    assert state(env, name)["Running"] is False
    # Started once more on the daemon's own socket, with its CDI driver surely loaded: the guard.
    status, body = env.daemon_api("POST", f"/containers/{name}/start")
    assert status >= 400 and "rdc: repo" in body["message"]


def _always_on(e2e: E2E, repo: Repo, env: RepoEnv) -> str:
    e2e.grant(env, GPU0)
    name = "always-on"
    run = env.docker(
        "run", "-d", "--name", name, "--restart", "always", "--device", GPU0, IMAGE, "sleep", "300"
    )
    assert run.returncode == 0, run.stderr
    assert state(env, name)["Running"] is True
    done = e2e.rdc("repo", "gpu", "revoke", repo.ref, "--device", GPU0)
    assert done.returncode == 12, done.stderr  # still running: said so
    return name


def test_a_daemon_killed_and_started_again_does_not_restart_the_holder(
    e2e: E2E, gamma: tuple[Repo, RepoEnv]
) -> None:
    repo, env = gamma
    name = _always_on(e2e, repo, env)
    pid = read_pid(env.runtime.daemon_paths.pidfile)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not pids.pid_alive(pid))
    lifecycle.repo_up(e2e.machine, repo)  # the daemon comes back and applies restart policies at once
    never_runs_again(env, name)
    # The killed daemon's bind of its data-root onto itself was undone at the new start, so after
    # `repo down` nothing of the repo stays mounted.
    lifecycle.repo_down(e2e.machine, repo)
    data_root = str(env.runtime.daemon_paths.data_root)
    assert not [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if data_root in line]


def test_down_and_up_does_not_restart_the_holder(e2e: E2E, gamma: tuple[Repo, RepoEnv]) -> None:
    repo, env = gamma
    name = _always_on(e2e, repo, env)
    lifecycle.repo_down(e2e.machine, repo)
    lifecycle.repo_up(e2e.machine, repo)
    never_runs_again(env, name)


def test_compose_up_of_a_service_holding_a_revoked_device_is_refused(e2e: E2E, tmp_short: Path) -> None:
    project = tmp_short / "gpuproj"
    project.mkdir()
    (project / "compose.yaml").write_text(
        f"services:\n  worker:\n    image: {IMAGE}\n    command: sleep 300\n    devices: [{GPU0}]\n"
    )
    e2e.grant(e2e.alpha, GPU0)
    try:
        up = e2e.alpha.compose(project, "up", "-d")
        assert up.returncode == 0, up.stderr
        stopped = e2e.alpha.compose(project, "stop")
        assert stopped.returncode == 0, stopped.stderr
        revoke(e2e)
        again = e2e.alpha.compose(project, "up", "-d")
        assert again.returncode != 0
        assert NOT_GRANTED in again.stderr, again.stderr
        listed = e2e.alpha.compose(project, "ps", "--format", "json")
        assert '"running"' not in listed.stdout.lower()
    finally:
        e2e.alpha.compose(project, "down")
        e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0)


def test_a_lease_that_ends_while_its_holder_runs(e2e: E2E) -> None:
    """No rdc process runs at the end: the next start is refused, and with `lease-end=stop` the repo's
    gate stops the running holder at its next housekeeping round (every 30 s)."""
    ref = e2e.alpha.repo.ref
    # Leased long enough to start the holder on a loaded host, then moved to end in 2 s.
    leased = e2e.rdc("repo", "gpu", "grant", ref, "--device", GPU0, "--for", "10m")
    assert leased.returncode == 0, leased.stderr
    name = f"leased-{os.getpid()}"
    assert e2e.rdc("machine", "config", "m1", "--set", "lease-end=stop").returncode == 0
    try:
        run = e2e.alpha.docker("run", "-d", "--name", name, "--device", GPU0, IMAGE, "sleep", "300")
        assert run.returncode == 0, run.stderr
        ending = e2e.rdc("repo", "gpu", "renew", ref, "--device", GPU0, "--for", "2s")
        assert ending.returncode == 0, ending.stderr
        assert wait_for(lambda: state(e2e.alpha, name)["Running"] is False, timeout=60)
        # Named as an ended lease (for a day), though emptying the repo rewrote the grants file.
        refused(e2e.alpha.docker("start", name), f"holds {GPU0}, whose lease to repo alpha ended at")
        assert "whose grant of vendor.example/gpu=0 ended" in e2e.alpha.runtime.gate_log.read_text()
    finally:
        e2e.rdc("machine", "config", "m1", "--unset", "lease-end")
        e2e.alpha.docker("rm", "-f", name)
        e2e.rdc("repo", "gpu", "revoke", ref, "--device", GPU0)


def lease_of(e2e: E2E) -> list[Grant]:
    """alpha's grants in force now, as rdc reads them."""
    return [g for g in read_grants(e2e.machine) if g.repo_id == e2e.alpha.repo.id]


def test_a_restart_policy_does_not_bring_a_holder_back_after_its_lease_ended(e2e: E2E) -> None:
    """With `lease-end=keep` (the default) a holder runs on past its lease, but once its process dies
    the daemon's restart policy (unseen by the gate) meets the runtime guard, which reads the lease's
    end: refused, in guard.log, and the container stays down. Killed while leased, it came back."""
    ref, guard_log = e2e.alpha.repo.ref, e2e.alpha.runtime.guard_log
    name = f"leased-always-{os.getpid()}"
    # Leased long enough for the control on a loaded host, then moved to end in 2 s.
    leased = e2e.rdc("repo", "gpu", "grant", ref, "--device", GPU0, "--for", "10m")
    assert leased.returncode == 0, leased.stderr
    try:
        run = e2e.alpha.docker(
            "run", "-d", "--name", name, "--restart", "always", "--device", GPU0, IMAGE, "sleep", "300"
        )
        assert run.returncode == 0, run.stderr
        container = run.stdout.strip()
        first = int(state(e2e.alpha, name)["Pid"])
        os.kill(first, signal.SIGKILL)  # the control: while the lease lasts, the policy starts it again
        assert wait_for(lambda: int(state(e2e.alpha, name).get("Pid") or 0) not in (0, first))
        ending = e2e.rdc("repo", "gpu", "renew", ref, "--device", GPU0, "--for", "2s")
        assert ending.returncode == 0, ending.stderr
        assert wait_for(lambda: not lease_of(e2e), timeout=40)  # the lease ended
        logged = guard_log.stat().st_size if guard_log.exists() else 0
        second = int(state(e2e.alpha, name)["Pid"])
        assert second > 0  # ran on past its lease (lease-end=keep)
        os.kill(second, signal.SIGKILL)
        assert wait_for(lambda: f"rdc: repo {ref} may not run" in str(state(e2e.alpha, name)["Error"]))
        assert wait_for(lambda: state(e2e.alpha, name)["Running"] is False)
        refusals = [json.loads(line) for line in guard_log.read_bytes()[logged:].decode().splitlines()]
        assert any(r["container"] == container and "/dev/fakegpu0" in r["refused"] for r in refusals)
        assert not pids.pid_alive(second)
        # Started on the daemon's own socket too, past the gate: the guard again.
        status, answer = e2e.alpha.daemon_api("POST", f"/containers/{name}/start")
        assert status >= 400 and f"rdc: repo {ref} may not run" in answer["message"], answer
        assert state(e2e.alpha, name)["Running"] is False
    finally:
        e2e.alpha.docker("rm", "-f", name)
        e2e.rdc("repo", "gpu", "revoke", ref, "--device", GPU0)
