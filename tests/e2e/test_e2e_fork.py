"""`rdc repo fork` is a real copy: the fork's daemon has the source's images, volumes, files and
containers, each naming only the fork's own paths (a bind-backed volume mounts the fork's copy of
the files, never the source's), and starts without the source's grants."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv, refused

from rediacc_core.repos import Repo, RepoStore, files_dir, repo_state_dir
from rediacc_core.runtime import layout
from rediacc_core.testing.dockerenv import import_busybox

DEVICE = "vendor.example/gpu=1"
# Appends a line to a volume and to a bind of the files directory, after printing what is there.
STEP = "cat /v/m /d/m 2>/dev/null; echo step >> /v/m; echo step >> /d/m"


def _env(e2e: E2E, repo: Repo) -> RepoEnv:
    runtime = layout.runtime_for(e2e.machine, repo)
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


def _bind_volumes(env: RepoEnv, files: Path) -> None:
    """In `env`, the two ways of a volume bound to a directory of the files: `docker volume create`
    (`vb`, on files/shared) and a mount's volume options at `docker run` (`vm`, on files/shared2)."""
    made = env.docker("run", "--rm", "-v", f"{files}:/f", IMAGE, "sh", "-c", _SEED)
    assert made.returncode == 0, made.stderr
    options = ["-o", "type=none", "-o", "o=bind", "-o", f"device={files}/shared"]
    created = env.docker("volume", "create", "-d", "local", *options, "vb")
    assert created.returncode == 0, created.stderr
    mount = (
        f"type=volume,src=vm,dst=/v,volume-opt=type=none,volume-opt=o=bind,volume-opt=device={files}/shared2"
    )
    ran = env.docker("run", "--rm", "--mount", mount, IMAGE, "cat", "/v/seed")
    assert ran.returncode == 0 and ran.stdout == "copied\n", ran.stderr


_SEED = "mkdir -p /f/shared /f/shared2 && echo copied > /f/shared/seed && echo copied > /f/shared2/seed"


def _fork_both_up(e2e: E2E, source: RepoEnv) -> tuple[RepoEnv, RepoEnv]:
    """Fork `source` (brought down for it) as theta:f, and bring both up: (source, fork)."""
    assert e2e.rdc("repo", "down", source.repo.ref).returncode == 0
    forked = e2e.rdc("repo", "fork", source.repo.ref, "--tag", "f")
    assert forked.returncode == 0, forked.stderr
    fork = RepoStore(e2e.machine).get_by_label("theta:f")
    for repo in (source.repo, fork):
        up = e2e.rdc("repo", "up", repo.ref)
        assert up.returncode == 0, up.stderr
    return _env(e2e, source.repo), _env(e2e, fork)


@pytest.mark.parametrize("volume", ["vb", "vm"], ids=["volume-create", "mount-volume-opt"])
def test_a_forks_bind_volume_reaches_only_the_forks_copy_of_the_files(
    e2e: E2E, source: RepoEnv, volume: str
) -> None:
    """The attack of issue 28: a volume bound to the source's files, forked, used by the fork while
    the source runs. It must write the fork's copy only, and not see what the source writes later."""
    src_files = files_dir(e2e.machine, source.repo.id)
    _bind_volumes(source, src_files)
    src, fork = _fork_both_up(e2e, source)
    fork_files = files_dir(e2e.machine, fork.repo.id)
    shared = "shared" if volume == "vb" else "shared2"

    wrote = fork.docker(
        "run", "--rm", "-v", f"{volume}:/v", IMAGE, "sh", "-c", "cat /v/seed; echo x > /v/from-fork"
    )
    # A bind volume still (it sees the files as they were copied), so this is where the write went:
    assert wrote.returncode == 0 and wrote.stdout == "copied\n", wrote.stderr
    assert not (src_files / shared / "from-fork").exists()  # where it landed before issue 28's fix
    assert (fork_files / shared / "from-fork").read_text() == "x\n"

    later = src.docker("run", "--rm", "-v", f"{volume}:/v", IMAGE, "sh", "-c", "echo y > /v/later")
    assert later.returncode == 0, later.stderr
    assert (src_files / shared / "later").read_text() == "y\n"  # the source's volume still works
    seen = fork.docker("run", "--rm", "-v", f"{volume}:/v", IMAGE, "ls", "/v")
    assert seen.returncode == 0 and sorted(seen.stdout.split()) == ["from-fork", "seed"], seen.stderr


def _addressed(path: Path, data: bytes) -> bool:
    """A blob of a content store, named by its own digest: bytes a tenant sent (a build's trace
    names the socket its client used), which nothing mounts and nobody can edit unnoticed."""
    return path.parent.name == "sha256" and hashlib.sha256(data).hexdigest() == path.name


def _naming(top: Path, needles: list[str]) -> dict[str, str]:
    """Every file (binary ones too) or symlink under `top` whose bytes or target hold a needle, by
    its path under `top`, with what surrounds the needle (to tell which record it is)."""
    found = {}
    encoded = [n.encode() for n in needles]
    for here, dirs, files in os.walk(top):
        for name in dirs + files:
            path = Path(here) / name
            if path.is_symlink():
                if any(n in os.readlink(path) for n in needles):
                    found[str(path.relative_to(top))] = os.readlink(path)
            elif path.is_file():
                data = path.read_bytes()
                if _addressed(path, data):
                    continue
                at = min((data.find(n) for n in encoded if n in data), default=-1)
                if at >= 0:
                    found[str(path.relative_to(top))] = repr(data[max(0, at - 120) : at + 120])
    return found


@pytest.fixture(params=["overlay2", "containerd"])
def image_store(request: pytest.FixtureRequest, e2e: E2E) -> Iterator[str]:
    """The machine's image store while the test's repos are made: the graph driver, or containerd's
    (images and snapshots in the repo's own containerd, whose records a fork copies too)."""
    if request.param == "containerd":
        changed = e2e.rdc("machine", "config", "m1", "--set", "image-store=containerd")
        assert changed.returncode == 0, changed.stderr
    try:
        yield str(request.param)
    finally:
        assert e2e.rdc("machine", "config", "m1", "--unset", "image-store").returncode == 0


def test_nothing_in_a_forks_copy_names_the_source(
    e2e: E2E, image_store: str, source: RepoEnv, tmp_short: Path
) -> None:
    """Volumes both ways, containers with binds and volumes, a network, a build: after the fork no
    file of the fork's state directory holds the source's id or run directory, in any record
    (JSON, the daemon's bolt databases, containerd's), with either image store."""
    driver = source.docker("info", "--format", "{{json .DriverStatus}}")
    assert ("io.containerd.snapshotter" in driver.stdout) == (image_store == "containerd"), driver.stdout
    files = files_dir(e2e.machine, source.repo.id)
    _bind_volumes(source, files)
    assert source.docker("volume", "create", "plain").returncode == 0
    assert source.docker("network", "create", "net").returncode == 0
    binds = ["-v", "vb:/b", "-v", "vm:/m", "-v", "plain:/p", "-v", f"{files}/shared:/s"]
    ran = source.docker("run", "--name", "kept", "--network", "net", *binds, IMAGE, "ls", "/b", "/m", "/s")
    assert ran.returncode == 0, ran.stderr
    # (The context's path is the client's, kept in BuildKit's content store as the tenant sent it.)
    (tmp_short / "Dockerfile").write_text(
        f"FROM {IMAGE}\nRUN --mount=type=cache,target=/c echo built > /c/x\n"
    )
    built = source.docker("build", "-t", "made:1", str(tmp_short), timeout=300)
    assert built.returncode == 0, built.stderr
    needles = [source.repo.id, str(layout.runtime_for(e2e.machine, source.repo).run_dir)]
    source_dir = repo_state_dir(e2e.machine, source.repo.id)
    # The source's own records do name its paths, in the bolt files too: the walk finds them.
    assert {"volumes/metadata.db", "volumes/vb/opts.json", "volumes/vm/opts.json"} <= set(
        _naming(source_dir / "docker", needles)
    )

    _, fork = _fork_both_up(e2e, source)
    fork_dir = repo_state_dir(e2e.machine, fork.repo.id)
    assert e2e.rdc("repo", "down", fork.repo.ref).returncode == 0  # the fork's daemon records too
    assert _naming(fork_dir, needles) == {}
    assert (fork_dir / "docker/volumes/metadata.db").is_file()
    assert (fork_dir / "docker/network/files/local-kv.db").is_file()
    # ... and the fork still has every object, working: the volumes (with their options), the network.
    assert e2e.rdc("repo", "up", fork.repo.ref).returncode == 0
    env = _env(e2e, fork.repo)
    started = env.docker("start", "-a", "kept")
    assert started.returncode == 0 and started.stdout.split() == [
        "/b:",
        "seed",
        "/m:",
        "seed",
        "/s:",
        "seed",
    ], started.stderr
    inspected = env.docker("volume", "inspect", "--format", "{{json .Options}}", "vb")
    assert str(fork.repo.id) in inspected.stdout and "bind" in inspected.stdout, inspected.stdout
    assert env.docker("network", "inspect", "net").returncode == 0
    assert env.docker("run", "--rm", "made:1", "true").returncode == 0
