"""Docker from the laptop: the real docker CLI reaches a remote repo's gate through `rdc repo env`."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from ssh_kit import Fleet, unmet_requirement

from rediacc_core.repos import RepoStore
from rediacc_core.runtime import layout
from rediacc_core.testing.dockerenv import docker_unavailable, import_busybox

DEVICE = "rediacc.io/dri=renderD128"


@pytest.fixture
def docker_ready() -> None:
    reason = docker_unavailable()
    unmet = unmet_requirement(reason)
    if unmet is not None:
        pytest.fail(unmet)
    if reason is not None:
        pytest.skip(reason)


def test_the_docker_cli_on_the_client_is_admitted_with_a_grant_and_refused_gpus_all(
    fleet: Fleet, docker_ready: None
) -> None:
    rdc = fleet.client.rdc
    for args in (("machine", "setup", "m1"), ("repo", "create", "dock@m1")):
        assert rdc(*args).returncode == 0
    assert rdc("repo", "gpu", "grant", "dock@m1", "--device", DEVICE).returncode == 0
    up = rdc("repo", "up", "dock@m1", timeout=180)
    assert up.returncode == 0, up.stderr
    machine = fleet.machines["m1"].machine
    runtime = layout.runtime_for(machine, RepoStore(machine).get_by_label("dock"))
    try:
        import_busybox(runtime.upstream_socket)  # the image, loaded on the machine's side
        env_line = rdc("repo", "env", "dock")  # the README way: no @machine
        assert env_line.returncode == 0, env_line.stderr
        assert env_line.stdout.startswith("export DOCKER_HOST=unix://")
        docker_env = dict(os.environ, DOCKER_HOST=env_line.stdout.strip().split("=", 1)[1])
        assert str(fleet.client.home) in docker_env["DOCKER_HOST"]  # a local socket, not the machine's

        def docker(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                ["docker", *args], env=docker_env, capture_output=True, text=True, timeout=120
            )

        admitted = docker("run", "--rm", "--network", "none", "--device", DEVICE, "bb", "ls", "/dev/dri")
        assert admitted.returncode == 0, admitted.stderr
        assert "renderD128" in admitted.stdout
        refused = docker("run", "--rm", "--network", "none", "--gpus", "all", "bb", "true")
        assert refused.returncode != 0
        assert "rediacc" in refused.stderr.lower() or "refused" in refused.stderr.lower(), refused.stderr
        again = rdc("repo", "env", "dock@m1")  # the open tunnel is reused
        assert again.stdout == env_line.stdout
        # The README's `export DOCKER_HOST=$(rdc repo docker-host gpu-a)` gives the same local socket.
        assert rdc("repo", "docker-host", "dock").stdout.strip() == docker_env["DOCKER_HOST"]
        # Revoking over SSH names the holder that still runs (exit 12), --stop stops it, and it
        # cannot start again.
        holder = docker(
            "run", "-d", "--name", "card", "--network", "none", "--device", DEVICE, "bb", "sleep", "300"
        )
        assert holder.returncode == 0, holder.stderr
        revoked = rdc("repo", "gpu", "revoke", "dock@m1", "--device", DEVICE, "-o", "json")
        assert revoked.returncode == 12, revoked.stderr
        (listed,) = json.loads(revoked.stdout)["holders"]
        assert listed["container"] == "card" and listed["running"] is True
        assert rdc("repo", "gpu", "grant", "dock@m1", "--device", DEVICE).returncode == 0
        stopped = rdc("repo", "gpu", "revoke", "dock@m1", "--device", DEVICE, "--stop")
        assert stopped.returncode == 0 and "Stopped container card" in stopped.stderr, stopped.stderr
        again_start = docker("start", "card")
        assert again_start.returncode != 0 and f"holds {DEVICE}" in again_start.stderr, again_start.stderr
    finally:
        rdc("repo", "tunnel", "dock@m1", "--close")
        down = rdc("repo", "down", "dock@m1", timeout=120)
        assert down.returncode == 0, down.stderr
        rdc("repo", "delete", "dock@m1", "--yes")


def gate_log_peers(rdc: Callable[..., subprocess.CompletedProcess[str]], ref: str) -> list[dict[str, Any]]:
    """The peers of the repo's audit lines, once there are some: the gate writes its decisions in
    batches, a quarter of a second apart or later on a loaded machine."""
    deadline = time.monotonic() + 30
    while True:
        log = rdc("repo", "gate", "log", ref, "-o", "json")
        assert log.returncode == 0, log.stderr
        peers = [json.loads(line)["peer"] for line in log.stdout.splitlines()]
        if peers or time.monotonic() > deadline:
            return peers
        time.sleep(0.5)


def test_the_docker_cli_reaches_a_fresh_tunnel_after_the_repo_and_the_machine_came_back(
    fleet: Fleet, docker_ready: None
) -> None:
    """`repo up` prints the DOCKER_HOST of here; after the repo is created again and the machine
    registered again, docker gets a new tunnel to the new repo, and the gate's audit names the SSH
    client behind each tunnelled request."""
    rdc = fleet.client.rdc
    machine = fleet.machines["m1"].machine
    assert rdc("machine", "setup", "m1").returncode == 0

    def bring_up() -> str:
        assert rdc("repo", "create", "again@m1").returncode == 0
        up = rdc("repo", "up", "again@m1", "-o", "json", timeout=180)
        assert up.returncode == 0, up.stderr
        host = json.loads(up.stdout)["dockerHost"]
        assert str(fleet.client.home) in host and f"export DOCKER_HOST={host}" in up.stderr
        runtime = layout.runtime_for(machine, RepoStore(machine).get_by_label("again"))
        import_busybox(runtime.upstream_socket)
        return str(host)

    def docker(host: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, DOCKER_HOST=host)
        return subprocess.run(["docker", *args], env=env, capture_output=True, text=True, timeout=120)

    def take_down() -> None:
        assert rdc("repo", "down", "again@m1", timeout=120).returncode == 0
        assert rdc("repo", "delete", "again@m1", "--yes").returncode == 0

    first = bring_up()
    try:
        assert docker(first, "run", "--rm", "--network", "none", "bb", "true").returncode == 0
        peers = gate_log_peers(rdc, "again@m1")
        assert peers and all(p.get("ssh", {}).get("client", "").startswith("127.0.0.1:") for p in peers), (
            peers
        )
        assert peers[0]["ssh"]["user"] == "root"
        take_down()
        second = bring_up()  # the same name, a new repo
        assert docker(second, "run", "--rm", "--network", "none", "bb", "true").returncode == 0
        assert rdc("machine", "remove", "m1").returncode == 0
        assert fleet.add(fleet.client, "m1", "--accept-host-key").returncode == 0
        third = rdc("repo", "docker-host", "again@m1").stdout.strip()
        ran = docker(third, "run", "--rm", "--network", "none", "bb", "true")
        assert ran.returncode == 0, ran.stderr
    finally:
        take_down()
