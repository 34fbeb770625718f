"""One real Slurm cluster for the suite (see `slurm_kit`): started once, every job cancelled and every
node resumed between tests, stopped at the end."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_kit import (
    NODES,
    Cluster,
    running_cluster,
    skip_reason,
    skip_suite,
    unmet_requirement,
    wait_for,
)

from rediacc_core.config import Config
from rediacc_core.grants.records import write_grants
from rediacc_core.machine import Machine


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = skip_reason()
    skip_suite(items, Path(__file__).parent, reason, unmet_requirement(reason))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    # Here, not at the top: the core env (no vendor plugin) collects this file too.
    pytest.importorskip("rediacc_nvidia.testing")  # the nodes' fake cards
    with running_cluster() as cluster:
        yield cluster


@pytest.fixture
def slurm(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with no job, every node idle, and no grant on any machine."""
    yield cluster
    cluster.cancel_all()
    for node in NODES:
        if f"slurmd-{node}" not in cluster.procs:
            cluster.start_slurmd(node)
        machine = Config.load(cluster.config_path).machine(node)
        write_grants(machine, [])
    cluster.resume(*NODES)
    wait_for("both nodes idle", lambda: all(cluster.node_state(n) == "idle" for n in NODES), timeout=60)


def machine(cluster: Cluster, node: str) -> Machine:
    return Config.load(cluster.config_path).machine(node)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True)
