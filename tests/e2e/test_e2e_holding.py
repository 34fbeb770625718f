"""Holding a device is a fact about the kernel, not a path: on the real Docker Engine, a container X
granted GPU0 opens its node and hands the descriptor over a Unix socket in a shared volume to a
container Y that names no device (SCM_RIGHTS, with a static helper the tenant copies in: nothing
checks a descriptor received, neither the device cgroup nor a path). Then revoke --stop, an
exclusive grant elsewhere (with and without --stop-holders) and a lease's end with lease-end=stop
must each leave no process of the repo holding the node, or refuse naming Y and its pid.

The effect is read from the host: every process in a cgroup of one of the repo's containers, with
a descriptor of FAKEGPU0's node by its number (the control: Y is found there before)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_kit import E2E, FAKEGPU0, GPU0, IMAGE, RepoEnv, wait_for
from holding_kit import build_fdpass, holding, running, start_with_helper

from rediacc_core.runtime.holdings import device_openers


@pytest.fixture(scope="module")
def fdpass(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fdpass(tmp_path_factory)


@dataclass
class Passed:
    holder: str  # X: created with GPU0, opened it, sent the descriptor
    keeper: str  # Y: names no device, holds the descriptor
    keeper_id: str
    keeper_pid: int


SEND = "exec 3</dev/fakegpu0; until [ -S /s/sock ]; do sleep 0.1; done; /fdpass send /s/sock 3; sleep 300"


def pass_descriptor(env: RepoEnv, fdpass: Path, holder: str, keeper: str, volume: str) -> None:
    """Y (`keeper`) waits on a socket in `volume`; X (`holder`, with GPU0) opens the node, sends it."""
    hold = ("/fdpass", "hold", "/s/sock", "sleep", "300")
    start_with_helper(env, fdpass, keeper, "-v", f"{volume}:/s", IMAGE, *hold)
    start_with_helper(env, fdpass, holder, "--device", GPU0, "-v", f"{volume}:/s", IMAGE, "sh", "-c", SEND)
    assert wait_for(lambda: "holding fd" in env.docker("logs", keeper).stdout)


@pytest.fixture
def passed(e2e: E2E, fdpass: Path) -> Iterator[Passed]:
    """X (granted GPU0) hands its descriptor of the node to Y (no device) over a shared volume."""
    env, tag = e2e.alpha, f"{os.getpid()}-{time.monotonic_ns() % 10**6}"
    holder, keeper, volume = f"x-{tag}", f"y-{tag}", f"fds-{tag}"
    assert env.docker("volume", "create", volume).returncode == 0
    e2e.grant(env, GPU0)
    try:
        pass_descriptor(env, fdpass, holder, keeper, volume)
        status, inspected = env.daemon_api("GET", f"/containers/{keeper}/json")
        assert status == 200 and inspected["HostConfig"].get("DeviceRequests") in (None, [])
        yield Passed(holder, keeper, inspected["Id"], int(inspected["State"]["Pid"]))
    finally:
        env.docker("rm", "-f", holder, keeper)
        env.docker("volume", "rm", volume)
        e2e.rdc("repo", "gpu", "revoke", env.repo.ref, "--device", GPU0)


def alone_with_the_descriptor(e2e: E2E, passed: Passed) -> None:
    """The tenant stops X: the old open-node check (only while a CDI holder runs) saw nothing now."""
    assert e2e.alpha.docker("stop", "-t", "0", passed.holder).returncode == 0
    assert holding(e2e.alpha) == {passed.keeper_pid: passed.keeper_id}  # the control: Y holds it


def test_revoke_names_the_keeper_and_stop_ends_it_even_once_the_grant_is_gone(
    e2e: E2E, passed: Passed
) -> None:
    alone_with_the_descriptor(e2e, passed)
    ref = e2e.alpha.repo.ref
    done = e2e.rdc("repo", "gpu", "revoke", ref, "--device", GPU0, "-o", "json")
    assert done.returncode == 12, done.stderr  # still held, said so
    assert [o["pid"] for o in json.loads(done.stdout)["openers"]] == [passed.keeper_pid]
    assert f"in container {passed.keeper} of {ref}" in done.stderr and "rerun with --stop" in done.stderr
    assert holding(e2e.alpha) == {passed.keeper_pid: passed.keeper_id}
    # The advice, run as printed: the grant is already gone, the keeper is stopped all the same.
    again = e2e.rdc("repo", "gpu", "revoke", ref, "--device", GPU0, "--stop")
    assert again.returncode == 0, again.stderr
    assert f"Stopped container {passed.keeper}" in again.stderr
    assert holding(e2e.alpha) == {} and not running(e2e.alpha, passed.keeper)


def test_revoke_stop_stops_the_holder_and_the_keeper(e2e: E2E, passed: Passed) -> None:
    assert set(holding(e2e.alpha)) >= {passed.keeper_pid}
    done = e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0, "--stop")
    assert done.returncode == 0, done.stderr
    assert f"Stopped container {passed.holder}" in done.stderr
    assert f"Stopped container {passed.keeper}" in done.stderr
    assert holding(e2e.alpha) == {}


def test_an_exclusive_grant_elsewhere_is_refused_until_the_keeper_is_stopped(
    e2e: E2E, passed: Passed
) -> None:
    alone_with_the_descriptor(e2e, passed)
    assert e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0).returncode == 12
    beta = e2e.beta.repo.ref
    try:
        blocked = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive")
        assert blocked.returncode == 4, blocked.stderr
        assert f"(pid {passed.keeper_pid}" in blocked.stderr
        assert (
            f"in container {passed.keeper} of alpha@m1" in blocked.stderr
            and "--stop-holders" in blocked.stderr
        )
        assert GPU0 not in e2e.rdc("repo", "gpu", "list", beta).stdout
        assert holding(e2e.alpha) == {passed.keeper_pid: passed.keeper_id}
        moved = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive", "--stop-holders")
        assert moved.returncode == 0, moved.stderr
        assert f"Stopped container {passed.keeper} of repo alpha@m1" in moved.stderr
        assert holding(e2e.alpha) == {} and not running(e2e.alpha, passed.keeper)
        lines = [json.loads(line) for line in e2e.alpha.runtime.audit_log.read_text().splitlines()]
        assert any(e.get("decision") == "handover" and passed.keeper in e["message"] for e in lines)
    finally:
        e2e.rdc("repo", "gpu", "revoke", beta, "--device", GPU0)


def test_a_lease_end_with_stop_ends_the_keeper_too(e2e: E2E, fdpass: Path) -> None:
    env, ref, tag = e2e.alpha, e2e.alpha.repo.ref, f"{os.getpid()}"
    holder, keeper, volume = f"lx-{tag}", f"ly-{tag}", f"lfds-{tag}"
    assert env.docker("volume", "create", volume).returncode == 0
    assert e2e.rdc("machine", "config", "m1", "--set", "lease-end=stop").returncode == 0
    try:
        leased = e2e.rdc("repo", "gpu", "grant", ref, "--device", GPU0, "--for", "20s")
        assert leased.returncode == 0, leased.stderr
        pass_descriptor(env, fdpass, holder, keeper, volume)
        assert holding(env)  # the control
        # At most 30 s after the end (the gate's housekeeping round), both are stopped.
        assert wait_for(lambda: not running(env, holder) and not running(env, keeper), timeout=90)
        assert holding(env) == {}
        said = f"stopped container {keeper}, whose processes held a device not granted"
        assert wait_for(lambda: said in env.runtime.gate_log.read_text())  # written once the stop returned
    finally:
        e2e.rdc("machine", "config", "m1", "--unset", "lease-end")
        env.docker("rm", "-f", holder, keeper)
        env.docker("volume", "rm", volume)
        e2e.rdc("repo", "gpu", "revoke", ref, "--device", GPU0)


def test_a_hard_link_of_the_node_is_found_by_number_and_cannot_leave_the_container(
    e2e: E2E, tmp_short: Path
) -> None:
    """A hard link is a name in the same filesystem: within the container's /dev (its own tmpfs) it
    works and the descriptor reads as the link's path; into a shared volume the kernel refuses it
    (EXDEV), so a container without the device can reach the node only by a descriptor."""
    env, tag = e2e.alpha, f"{os.getpid()}"
    name, volume = f"linker-{tag}", f"lnk-{tag}"
    assert env.docker("volume", "create", volume).returncode == 0
    e2e.grant(env, GPU0)
    script = (
        "ln /dev/fakegpu0 /s/gpu 2>/s/cross; ln /dev/fakegpu0 /dev/.g && exec 3</dev/.g && rm /dev/fakegpu0; "
        "touch /s/ready; sleep 300"
    )
    try:
        run = env.docker(
            "run", "-d", "--name", name, "--device", GPU0, "-v", f"{volume}:/s", IMAGE, "sh", "-c", script
        )
        assert run.returncode == 0, run.stderr
        look = ["run", "--rm", "-v", f"{volume}:/s", IMAGE, "sh", "-c"]
        assert wait_for(lambda: env.docker(*look, "test -e /s/ready").returncode == 0)
        cross = env.docker(*look, "cat /s/cross; test -e /s/gpu && echo linked")
        assert "Invalid cross-device link" in cross.stdout and "linked" not in cross.stdout, cross.stdout
        # A node made in the volume opens only where the device cgroup admits its number: /dev/full's
        # (Docker's default set, the control) does, /dev/kmsg's (1:11, as a GPU's is: in no default) not.
        made = env.docker(
            *look, "mknod /s/f c 1 7 && mknod /s/k c 1 11 && head -c 1 /s/f | wc -c; head -c 1 /s/k"
        )
        assert made.stdout.split() == ["1"] and "Operation not permitted" in made.stderr, made
        found = device_openers(e2e.machine, env.repo, [("c", *FAKEGPU0)])
        assert [o.how for o in found] == ["fd 3 (/dev/.g)"], found
        done = e2e.rdc("repo", "gpu", "revoke", env.repo.ref, "--device", GPU0, "--stop")
        assert done.returncode == 0, done.stderr
        assert holding(env) == {}
    finally:
        env.docker("rm", "-f", name)
        env.docker("volume", "rm", volume)
        e2e.rdc("repo", "gpu", "revoke", env.repo.ref, "--device", GPU0)
