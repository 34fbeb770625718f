"""A lease through the whole path: repo `alpha` of machine n1 up (its own dockerd behind its gate),
the real docker CLI asking for the card before, during and after its Slurm lease. Needs a Docker
Engine with CDI (`.ci/install-docker.sh`); run it under `flock /tmp/e2e.lock` beside other e2e runs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from e2e_kit import IMAGE, RepoEnv, refused
from slurm_kit import REQUIRED, Cluster, repo_up, wait_for

from rediacc_core.testing.dockerenv import docker_unavailable

GPU0 = "nvidia.com/gpu=0"


@pytest.fixture
def alpha(slurm: Cluster) -> Iterator[RepoEnv]:
    reason = docker_unavailable()
    if reason is not None:
        if os.environ.get(REQUIRED) == "1":
            pytest.fail(
                f"{REQUIRED}=1, but no Docker Engine to run a repo: {reason} (bash .ci/install-docker.sh)"
            )
        pytest.skip(reason)
    with repo_up(slurm, "n1", "alpha") as env:
        yield env


def running(alpha: RepoEnv, name: str) -> bool:
    return alpha.docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true"


def test_the_gate_admits_the_card_only_while_the_lease_runs_and_its_end_stops_the_holder(
    slurm: Cluster, alpha: RepoEnv
) -> None:
    done = slurm.rdc("repo", "slurm", "allow", "alpha@n1", "--account", "teama")
    assert done.returncode == 0, done.stderr
    refused(alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true"), GPU0)
    job = slurm.lease("alpha", node="n1")
    started = alpha.docker("run", "-d", "--name", "holder", "--device", GPU0, IMAGE, "sleep", "600")
    assert started.returncode == 0, started.stderr
    assert running(alpha, "holder")
    slurm.slurm("scancel", job)
    # The epilog revokes with --stop: the holder is stopped, and it cannot start again.
    wait_for("the holder to be stopped", lambda: not running(alpha, "holder"), timeout=60)
    refused(alpha.docker("start", "holder"), GPU0)
