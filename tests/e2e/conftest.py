"""End-to-end environment: a simulated machine with fake GPUs, two repos up behind their gates.

Runs only with RDC_E2E=1 (tox -e e2e), as root, with dockerd >= 25 and busybox-static installed.
Once per session: a machine root under /tmp (short, for socket paths) with device nodes made by
mknod and CDI specs written by hand, repos `alpha` and `beta` brought up by `lifecycle.repo_up`
(their own dockerd each, then the gate), and a busybox image `bb:latest` in each daemon.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import (
    E2E,
    IMAGE,
    REQUIRED,
    RepoEnv,
    build_machine_root,
    client_env,
    skip_reason,
    unmet_requirement,
    use_engine,
)
from suite_guard import RequiredSuite

from rediacc_core.config import Config
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.settings import set_setting
from rediacc_core.testing.dockerenv import import_busybox

use_engine()

NET_PATH = os.environ.get("RDC_E2E_NET_PATH")

# Where RDC_E2E_REQUIRED=1 (tox's e2e envs, CI): a machine that cannot run the suite is a usage
# error, and a skipped test a failure unless allowed_skips.txt names it.
GUARD = RequiredSuite("end-to-end", Path(__file__).parent, REQUIRED, unmet_requirement)


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(GUARD):
        config.pluginmanager.register(GUARD, "rdc-e2e-required")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = skip_reason()
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def e2e() -> Iterator[E2E]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="rdce", dir="/tmp"))  # short: socket paths are limited
    root = base / "m"
    config_path = base / "rdc.yaml"
    build_machine_root(root)
    config = Config.load(config_path)
    config.add("m1", root)
    config.save()
    machine = Config.load(config_path).machine("m1")
    # The repos' gates serve from two worker processes, so every attack and workload here also
    # crosses workers (a bind checked by one, started through another); the in-process suites
    # drive the default, one process.
    set_setting(machine, "gate-workers", "2")
    # Which path out the repos' namespaces take (CI runs the network files on both: `kernel` under
    # .ci/forwarding-host where the host does not forward); unset, the machine's default (auto).
    if NET_PATH is not None:
        set_setting(machine, "net-path", NET_PATH)
    store = RepoStore(machine)
    env = client_env(base)
    started: list[Repo] = []
    try:
        repos = {}
        for name in ("alpha", "beta"):
            repo = store.create(name)
            started.append(repo)
            runtime = lifecycle.repo_up(machine, repo)
            import_busybox(runtime.upstream_socket, IMAGE)
            repos[name] = RepoEnv(repo, runtime, {**env, "DOCKER_HOST": runtime.docker_host_url})
        yield E2E(root, machine, config_path, repos["alpha"], repos["beta"])
    finally:
        for repo in started:
            lifecycle.repo_down(machine, repo)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tmp_short() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="rdct", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
