"""After a repo's daemon stops, every process and mount of the repo goes (real processes and mounts).

The daemon's own runtime processes are found by their command line naming the daemon's directories,
a container's processes by its cgroup or its mount namespace, mounts by where they lie.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core.runtime import teardown
from rediacc_core.runtime.layout import DaemonPaths

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mount namespaces, mounts)")


@pytest.fixture
def paths() -> Iterator[DaemonPaths]:
    base = Path(tempfile.mkdtemp(prefix="rdtd", dir="/tmp"))
    paths = DaemonPaths(base / "d", base / "data")
    paths.exec_root.mkdir(parents=True)
    paths.data_root.mkdir()
    yield paths
    shutil.rmtree(base, ignore_errors=True)


def sleeper(*extra: str, program: str = "containerd-shim-runc-v2") -> subprocess.Popen[bytes]:
    """A process named like a container runtime program, with `extra` on its command line."""
    code = "import time; time.sleep(300)"
    return subprocess.Popen(
        ["bash", "-c", f'exec -a {program} {sys.executable} -c "{code}" "$@"', "x", *extra]
    )


def wait_started(process: subprocess.Popen[bytes], program: bytes) -> None:
    """Until the process runs as `program` (bash has exec'd it)."""
    deadline = time.monotonic() + 10
    while not Path(f"/proc/{process.pid}/cmdline").read_bytes().startswith(program + b"\0"):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_runtime_process_naming_the_daemon_directories_is_killed(paths: DaemonPaths) -> None:
    address = f"{paths.exec_root}/containerd/containerd.sock"
    shim = sleeper("-namespace", "moby", "-address", address)
    other = sleeper("-namespace", "moby", "-address", "/run/other/exec/containerd/containerd.sock")
    try:
        wait_started(shim, b"containerd-shim-runc-v2")
        wait_started(other, b"containerd-shim-runc-v2")
        fp = teardown.footprint(paths)
        assert list(teardown.processes(fp)) == [shim.pid]
        swept = teardown.sweep(fp)
        assert shim.wait(10) == -9
        assert swept.killed == [f"containerd-shim-runc-v2 (pid {shim.pid}, the repo daemon's runtime)"]
        assert swept.left == [] and other.poll() is None  # another daemon's shim is not touched
    finally:
        for process in (shim, other):
            process.kill()
            process.wait()


def test_a_process_named_like_the_runtime_elsewhere_or_any_other_process_is_spared(
    paths: DaemonPaths,
) -> None:
    reader = sleeper(str(paths.data_root / "x"), program="tail")  # not a runtime program
    try:
        wait_started(reader, b"tail")
        assert teardown.processes(teardown.footprint(paths)) == {}
    finally:
        reader.kill()
        reader.wait()


@as_root
def test_a_process_in_a_container_mount_namespace_is_killed_wherever_its_cgroup(paths: DaemonPaths) -> None:
    escaped = subprocess.Popen(["unshare", "--mount", "sleep", "300"])
    try:
        deadline = time.monotonic() + 10
        # unshare(1) enters the new namespace, then execs sleep: wait for both, or the name is racy.
        while (
            os.readlink(f"/proc/{escaped.pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
            or Path(f"/proc/{escaped.pid}/comm").read_text().strip() != "sleep"
        ):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        namespace = os.readlink(f"/proc/{escaped.pid}/ns/mnt")
        fp = teardown.Footprint(paths, mount_namespaces=frozenset({namespace}))
        swept = teardown.sweep(fp)
        assert escaped.wait(10) == -9
        assert swept.killed == [f"sleep (pid {escaped.pid}, in a container's mount namespace)"]
    finally:
        escaped.kill()
        escaped.wait()


def test_the_host_mount_namespace_is_never_a_container_one(paths: DaemonPaths) -> None:
    task = paths.exec_root / "containerd/daemon/io.containerd.runtime.v2.task/moby" / ("a" * 64)
    task.mkdir(parents=True)
    (task / "init.pid").write_text(f"{os.getpid()}\n")  # a stale pid file naming a host process
    fp = teardown.footprint(paths)
    assert fp.container_ids == {"a" * 64}
    assert fp.mount_namespaces == frozenset()


@as_root
def test_mounts_under_the_daemon_directories_are_unmounted_deepest_first(paths: DaemonPaths) -> None:
    outer = paths.data_root / "overlay2" / "x" / "merged"
    inner = outer / "inner"
    outer.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(outer)], check=True)
    inner.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(inner)], check=True)
    fp = teardown.footprint(paths)
    assert teardown.mounts(fp) == [str(inner), str(outer)]
    swept = teardown.sweep(fp)
    assert swept.unmounted == [str(inner), str(outer)]
    assert teardown.mounts(fp) == [] and swept.left == []


def test_mountinfo_escapes_are_read_back() -> None:
    assert teardown._unescape(r"/tmp/a\040b\011c\134d") == "/tmp/a b\tc\\d"
