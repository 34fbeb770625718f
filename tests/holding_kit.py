"""The e2e suites' view of who holds a fake GPU's node, and the static helper a tenant copies into its
containers to pass a descriptor over a Unix socket (`tests/e2e/helpers/fdpass.c`)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from e2e_kit import FAKEGPU0, RepoEnv

HELPER = Path(__file__).parent / "e2e" / "helpers" / "fdpass.c"


def build_fdpass(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The helper, built static (it runs in a busybox image); skips the test without a compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for tests/e2e/helpers/fdpass.c (.ci/install-bench-tools.sh installs one)")
    out = tmp_path_factory.mktemp("fdpass") / "fdpass"
    subprocess.run([compiler, "-static", "-Os", "-o", str(out), str(HELPER)], check=True, timeout=120)
    return out


def holding(env: RepoEnv) -> dict[int, str]:
    """From the host: pid -> container id of every process of `env`'s containers with a descriptor
    of FAKEGPU0's node, read from /proc by device number."""
    ids = {c["Id"] for c in env.containers()}
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cgroup = Path(f"/proc/{entry}/cgroup").read_text()
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        owner = next((i for i in ids if i in cgroup), None)
        if owner is None:
            continue
        for fd in fds:
            try:
                st = os.stat(f"/proc/{entry}/fd/{fd}")
            except OSError:
                continue
            if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) == FAKEGPU0:
                found[int(entry)] = owner
    return found


def running(env: RepoEnv, name: str) -> bool:
    status, inspected = env.daemon_api("GET", f"/containers/{name}/json")
    assert status == 200, inspected
    return bool(inspected["State"]["Running"])


def start_with_helper(env: RepoEnv, fdpass: Path, name: str, *args: str) -> None:
    created = env.docker("create", "--name", name, *args)
    assert created.returncode == 0, created.stderr
    copied = env.docker("cp", str(fdpass), f"{name}:/fdpass")
    assert copied.returncode == 0, copied.stderr
    started = env.docker("start", name)
    assert started.returncode == 0, started.stderr
