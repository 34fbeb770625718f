"""One real Slurm 26.05 cluster with three external nodes for the suite (see `slurm_ext_kit`):
started once, every job cancelled and every grant gone between tests, stopped at the end."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_ext_kit import NODES, ext_skip_reason, ext_unmet_requirement, machine, running_ext_cluster
from slurm_kit import Cluster, skip_suite

from rediacc_core.grants.records import write_grants


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = ext_skip_reason()
    skip_suite(items, Path(__file__).parent, reason, ext_unmet_requirement(reason))


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = ext_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    pytest.importorskip("rediacc_nvidia.testing")  # the boxes' fake cards
    with running_ext_cluster() as cluster:
        yield cluster


@pytest.fixture
def slurm(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with no job and no grant on any box."""
    yield cluster
    cluster.cancel_all()
    for node in NODES:
        write_grants(machine(cluster, node), [])
