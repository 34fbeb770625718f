"""`rdc repo fork` is a real copy: the fork's daemon has the source's images, volumes, files and
containers, each naming only the fork's own paths, and starts without the source's grants."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv, refused

from rediacc_core.repos import Repo, RepoStore, files_dir, repo_state_dir
from rediacc_core.runtime import lifecycle
from rediacc_core.testing.dockerenv import import_busybox

DEVICE = "vendor.example/gpu=1"
# Appends a line to a volume and to a bind of the files directory, after printing what is there.
STEP = "cat /v/m /d/m 2>/dev/null; echo step >> /v/m; echo step >> /d/m"


def _env(e2e: E2E, repo: Repo) -> RepoEnv:
    runtime = lifecycle.runtime_for(e2e.machine, repo)
    return RepoEnv(repo, runtime, {**e2e.alpha.env, "DOCKER_HOST": runtime.docker_host_url})


@pytest.fixture
def source(e2e: E2E) -> Iterator[RepoEnv]:
    made = e2e.rdc("repo", "create", "theta@m1")
    assert made.returncode == 0, made.stderr
    repo = RepoStore(e2e.machine).get_by_label("theta")
    try:
        assert e2e.rdc("repo", "up", repo.ref).returncode == 0
        env = _env(e2e, repo)
        import_busybox(env.daemon, IMAGE)
        yield env
    finally:
        for found in RepoStore(e2e.machine).list():
            if found.name == "theta":
                e2e.rdc("repo", "down", found.ref)
                e2e.rdc("repo", "delete", found.ref, "--yes")


def test_a_fork_is_a_copy_whose_containers_use_only_its_own_data_and_hold_no_grant(
    e2e: E2E, source: RepoEnv
) -> None:
    files = files_dir(e2e.machine, source.repo.id)
    (files / "d").mkdir()
    assert source.docker("volume", "create", "vol").returncode == 0
    made = source.docker(
        "create", "--name", "steps", "-v", "vol:/v", "-v", f"{files}/d:/d", IMAGE, "sh", "-c", STEP
    )
    assert made.returncode == 0, made.stderr
    assert source.docker("start", "-a", "steps").returncode == 0
    e2e.grant(source, DEVICE)
    gpu = source.docker("create", "--name", "gpu", "--device", DEVICE, IMAGE, "ls", "/dev")
    assert gpu.returncode == 0, gpu.stderr

    up = e2e.rdc("repo", "fork", source.repo.ref, "--tag", "copy")
    assert up.returncode == 12 and "rdc repo down" in up.stderr  # the source is up: refused
    assert e2e.rdc("repo", "down", source.repo.ref).returncode == 0
    forked = e2e.rdc("repo", "fork", source.repo.ref, "--tag", "copy")
    assert forked.returncode == 0, forked.stderr
    assert "2 container(s)" in forked.stderr
    fork = RepoStore(e2e.machine).get_by_label("theta:copy")
    assert e2e.rdc("repo", "up", fork.ref).returncode == 0
    env = _env(e2e, fork)

    assert env.docker("image", "inspect", IMAGE).returncode == 0  # the source's images, not imported again
    started = env.docker("start", "-a", "steps")
    assert started.returncode == 0, started.stderr
    mounts = env.docker("inspect", "--format", "{{json .Mounts}}", "steps").stdout
    assert started.stdout.split() == ["step", "step"], (started.stderr, mounts)  # the source's, as copied
    fork_dir = repo_state_dir(e2e.machine, fork.id)
    assert (fork_dir / "files/d/m").read_text() == "step\nstep\n"
    assert (fork_dir / "docker/volumes/vol/_data/m").read_text() == "step\nstep\n"
    # ... and the source's own stayed as they were: the fork wrote only its copies.
    source_dir = repo_state_dir(e2e.machine, source.repo.id)
    assert (source_dir / "files/d/m").read_text() == "step\n"
    assert (source_dir / "docker/volumes/vol/_data/m").read_text() == "step\n"
    inspected = env.docker("inspect", "--format", "{{.HostsPath}} {{.LogPath}} {{json .Mounts}}", "steps")
    assert inspected.returncode == 0, inspected.stderr
    assert str(source_dir) not in inspected.stdout and str(fork_dir) in inspected.stdout

    # The grant stayed with the source: the copied GPU container does not start in the fork.
    refused(env.docker("start", "-a", "gpu"), DEVICE)
    e2e.grant(env, DEVICE)
    admitted = env.docker("start", "-a", "gpu")
    assert admitted.returncode == 0 and "fakegpu1" in admitted.stdout.split(), admitted.stderr
