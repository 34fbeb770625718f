"""One real Slurm 26.05 cluster with three external nodes for the suite (see `slurm_ext_kit`):
started once, every job cancelled and every grant gone between tests, stopped at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_ext_kit import (
    HOST,
    NODES,
    UUIDS,
    ext_skip_reason,
    ext_unmet_requirement,
    machine,
    make_network,
    sid_cluster,
)
from slurm_kit import (
    Cluster,
    accounts,
    budgets,
    machine_tools,
    skip_suite,
    slurm_conf,
    start_accounting,
    start_controller,
    wait_for,
)

from rediacc_core.config import Config
from rediacc_core.grants.records import write_grants
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = ext_skip_reason()
    skip_suite(items, Path(__file__).parent, reason, ext_unmet_requirement(reason))


def _box(cluster: Cluster, node: str) -> None:
    # Here, not at the top: the core env (no vendor plugin) collects this file too.
    nvidia_testing = pytest.importorskip("rediacc_nvidia.testing")

    fm = FakeMachine(cluster.root(node), name=node)
    first, second = UUIDS[node], UUIDS[node].replace("-7d4f-", "-1e2f-")
    nvidia_testing.nvidia_machine(fm, nvidia_testing.two_a100s(first, second), compute_caps=("8.0", "8.0"))
    plugins = get_plugins()
    run_setup(fm.machine, plugins, {opt.name: opt.default for opt in plugins.setup_options() if opt.name})


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = ext_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="rdcx", dir="/tmp"))
    cluster = sid_cluster(base)
    try:
        config = Config.load(cluster.config_path)
        (base / "ops").mkdir()
        config.add("ops", base / "ops")
        for node in NODES:
            cluster.root(node).mkdir(parents=True)
            config.add(node, cluster.root(node))
        config.save()
        machine_tools(cluster, base / "ops")  # the operator's host: the Slurm tools, no GPU
        (base / "etc").mkdir()
        lines, gres = [], ["AutoDetect=off"]
        for node in NODES:
            _box(cluster, node)
            box = machine(cluster, node)
            RepoStore(box).create("alpha")
            RepoStore(box).create("beta")
            made = cluster.rdc("slurm", "gres", node, "--node", node, "--conf", "/etc/slurm/gres.conf")
            assert made.returncode == 0, made.stderr
            lines.append(f"{made.stdout.strip()} CPUs=2 RealMemory=1000 State=EXTERNAL")
            text = box.path("/etc/slurm/gres.conf").read_text()
            gres += [line for line in text.splitlines() if line.startswith("NodeName=")]
        cluster.conf.write_text(slurm_conf(cluster, lines, host=HOST, hooks=False))
        (base / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        make_network(cluster)
        start_accounting(cluster)
        cluster.slurm("sacctmgr", "-i", "add", "cluster", "rdcs")
        accounts(cluster)
        start_controller(cluster)
        wait_for(
            "slurmctld", lambda: cluster.slurm("scontrol", "ping", check=False).returncode == 0, timeout=60
        )
        budgets(cluster)
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get("RDC_SLURM_KEEP"):  # set it to read the daemons' logs after a run
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def slurm(cluster: Cluster) -> Iterator[Cluster]:
    """The cluster with no job and no grant on any box."""
    yield cluster
    cluster.cancel_all()
    for node in NODES:
        write_grants(machine(cluster, node), [])
