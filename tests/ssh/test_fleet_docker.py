"""Docker from the laptop: the real docker CLI reaches a remote repo's gate through `rdc repo env`."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from ssh_kit import Fleet

from rediacc_core.repos import RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.testing.dockerenv import docker_unavailable, import_busybox

DEVICE = "rediacc.io/dri=renderD128"


@pytest.fixture
def docker_ready() -> None:
    reason = docker_unavailable()
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
    runtime = lifecycle.runtime_for(machine, RepoStore(machine).get_by_label("dock"))
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
