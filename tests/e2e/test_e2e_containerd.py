"""Repos never share a containerd, whatever the host runs.

dockerd uses the host's containerd whenever `/run/containerd/containerd.sock` exists (every host
with Docker CE has one): two repos would then keep their containers, shims and images in one
containerd, in one namespace. Here a "system" containerd serves that socket (started for the test in
a private mount namespace, unless the host runs one already), and two repos brought up beside it
keep everything in containerds of their own: the system one never sees them, neither sees the
other's, and `rdc repo down` of one leaves the other running.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, RepoEnv

SYSTEM_SOCKET = Path("/run/containerd/containerd.sock")


def ctr(address: Path, *args: str) -> list[str]:
    out = subprocess.run(
        ["ctr", "--address", str(address), *args], capture_output=True, text=True, timeout=60, check=True
    )
    return sorted(line for line in out.stdout.split() if line)


@pytest.fixture(scope="module")
def system_containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if shutil.which("ctr") is None or shutil.which("containerd") is None:
        pytest.skip("needs containerd and ctr")
    if SYSTEM_SOCKET.exists():
        yield SYSTEM_SOCKET  # the host runs one: the repos must keep away from it all the same
        return
    base = tmp_path_factory.mktemp("sysctrd")
    config = base / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{base}/root"\nstate = "{base}/state"\n'
        f'[grpc]\n  address = "{SYSTEM_SOCKET}"\n[ttrpc]\n  address = "{SYSTEM_SOCKET}.ttrpc"\n'
    )
    made_dir = not SYSTEM_SOCKET.parent.exists()
    log = open(base / "containerd.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "containerd", "--config", str(config)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 30
        while not SYSTEM_SOCKET.exists():
            assert process.poll() is None and time.monotonic() < deadline, (
                base / "containerd.log"
            ).read_text()
            time.sleep(0.05)
        yield SYSTEM_SOCKET
    finally:
        process.terminate()
        process.wait(30)
        log.close()
        for leftover in (SYSTEM_SOCKET, Path(f"{SYSTEM_SOCKET}.ttrpc")):
            leftover.unlink(missing_ok=True)
        if made_dir:
            shutil.rmtree(SYSTEM_SOCKET.parent, ignore_errors=True)


def run_sleeper(repo: RepoEnv) -> str:
    started = repo.docker("run", "-d", IMAGE, "sleep", "600")
    assert started.returncode == 0, started.stderr
    return started.stdout.strip()


def processes_naming(path: Path) -> list[str]:
    mark = os.fsencode(path)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if mark in cmdline:
                words = cmdline.replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry}: {words}")
    return found


def test_two_repos_beside_a_system_containerd_share_nothing(e2e: E2E, system_containerd: Path) -> None:
    namespaces_before = ctr(system_containerd, "namespaces", "list", "-q")
    with e2e.extra_repo("ctra") as a, e2e.extra_repo("ctrb") as b:
        a_id, b_id = run_sleeper(a), run_sleeper(b)
        a_sock = a.runtime.daemon_paths.containerd_socket
        b_sock = b.runtime.daemon_paths.containerd_socket
        # Each repo's containers are in its own containerd, under its own directories.
        assert a_id in ctr(a_sock, "-n", "moby", "containers", "list", "-q")
        assert b_id not in ctr(a_sock, "-n", "moby", "containers", "list", "-q")
        assert b_id in ctr(b_sock, "-n", "moby", "containers", "list", "-q")
        paths = a.runtime.daemon_paths
        assert processes_naming(paths.containerd_config)  # a containerd of its own
        assert f'root = "{paths.data_root}/' in paths.containerd_config.read_text()
        # The system containerd got nothing of either.
        assert ctr(system_containerd, "namespaces", "list", "-q") == namespaces_before
        for namespace in namespaces_before:
            listed = ctr(system_containerd, "-n", namespace, "containers", "list", "-q")
            assert a_id not in listed and b_id not in listed
        # Neither repo's daemon lists the other's containers or images.
        assert b_id[:12] not in a.docker("ps", "-a", "--no-trunc").stdout

        down = e2e.rdc("repo", "down", a.repo.ref)
        assert down.returncode == 0, down.stderr
        assert "containerd (pid" in down.stderr
        assert processes_naming(a.runtime.daemon_paths.workdir) == []  # no containerd, shim or sleep
        still = b.docker("inspect", "-f", "{{.State.Running}}", b_id)
        assert still.stdout.strip() == "true", still.stderr


def test_with_the_containerd_image_store_each_repo_sees_only_its_own_images(
    e2e: E2E, system_containerd: Path
) -> None:
    """The containerd image store (Engine 29's default) keeps images in containerd: in the repo's own."""
    namespaces_before = ctr(system_containerd, "namespaces", "list", "-q")
    changed = e2e.rdc("machine", "config", "m1", "--set", "image-store=containerd")
    assert changed.returncode == 0, changed.stderr
    try:
        with e2e.extra_repo("imga") as a, e2e.extra_repo("imgb") as b:
            for repo in (a, b):
                info = repo.docker("info", "-f", "{{json .DriverStatus}}")
                assert "io.containerd.snapshotter" in info.stdout, info.stdout + info.stderr
            tagged = a.docker("tag", IMAGE, "only-a:1")
            assert tagged.returncode == 0, tagged.stderr
            a_id = run_sleeper(a)
            assert "only-a" in a.docker("images", "--format", "{{.Repository}}").stdout
            assert "only-a" not in b.docker("images", "--format", "{{.Repository}}").stdout
            assert a_id[:12] not in b.docker("ps", "-a", "--no-trunc").stdout
            a_sock = a.runtime.daemon_paths.containerd_socket
            b_sock = b.runtime.daemon_paths.containerd_socket
            assert any("only-a" in name for name in ctr(a_sock, "-n", "moby", "images", "list", "-q"))
            assert not any("only-a" in name for name in ctr(b_sock, "-n", "moby", "images", "list", "-q"))
            assert a_id in ctr(a_sock, "-n", "moby", "containers", "list", "-q")
            assert a_id not in ctr(b_sock, "-n", "moby", "containers", "list", "-q")
            # The host's containerd holds no image, container or namespace of either.
            assert ctr(system_containerd, "namespaces", "list", "-q") == namespaces_before
            for namespace in namespaces_before:
                images = ctr(system_containerd, "-n", namespace, "images", "list", "-q")
                assert not any("only-a" in name for name in images)
    finally:
        reset = e2e.rdc("machine", "config", "m1", "--unset", "image-store")
        assert reset.returncode == 0, reset.stderr
