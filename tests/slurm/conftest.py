"""One real Slurm cluster for the suite (see `slurm_kit`): started once, every job cancelled and every
node resumed between tests, stopped at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_kit import (
    NODES,
    SUBNET,
    UUIDS,
    Cluster,
    accounts,
    budgets,
    hook_scripts,
    machine_tools,
    make_network,
    skip_reason,
    slurm_conf,
    start_accounting,
    unmet_requirement,
    wait_for,
)

from rediacc_core.config import Config
from rediacc_core.grants.records import write_grants
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = skip_reason()
    unmet = unmet_requirement(reason)
    if unmet is not None:
        raise pytest.UsageError(unmet)
    for item in items:
        if here in item.path.parents and reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _node_machine(cluster: Cluster, node: str) -> Machine:
    # Here, not at the top: the core env (no vendor plugin) collects this file too.
    nvidia_testing = pytest.importorskip("rediacc_nvidia.testing")

    fm = FakeMachine(cluster.root(node), name=node)
    nvidia_testing.nvidia_machine(fm, nvidia_testing.two_a100s(*UUIDS[node]), compute_caps=("8.0", "8.0"))
    machine_tools(cluster, fm.root)
    return fm.machine


def _setup(machine: Machine) -> None:
    plugins = get_plugins()
    run_setup(machine, plugins, {opt.name: opt.default for opt in plugins.setup_options() if opt.name})


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    base = Path(tempfile.mkdtemp(prefix="rdcs", dir="/tmp"))
    cluster = Cluster(base, f"rs{base.name[-5:]}", base / "rdc.yaml")
    try:
        config = Config.load(cluster.config_path)
        for node in NODES:
            cluster.root(node).mkdir(parents=True)
            config.add(node, cluster.root(node))
        config.save()
        (base / "etc").mkdir()
        lines = []
        for i, node in enumerate(NODES):
            machine = Config.load(cluster.config_path).machine(node)
            _node_machine(cluster, node)
            _setup(machine)
            RepoStore(machine).create("alpha")
            RepoStore(machine).create("beta")
            made = cluster.rdc("slurm", "gres", node, "--node", node, "--conf", "/etc/slurm/gres.conf")
            assert made.returncode == 0, made.stderr
            lines.append(
                f"{made.stdout.strip()} NodeAddr={SUBNET}.{11 + i} CPUs=2 RealMemory=1000 State=UNKNOWN"
            )
            (base / node / "spool").mkdir(parents=True)
        text = slurm_conf(cluster, lines)
        cluster.conf.write_text(text)
        for node in NODES:
            (cluster.root(node) / "etc/slurm/slurm.conf").write_text(text)
        make_network(cluster)
        start_accounting(cluster)
        hook_scripts(cluster)
        cluster.slurm("sacctmgr", "-i", "add", "cluster", "rdcs")
        accounts(cluster)
        cluster.start(
            "slurmctld",
            ["nsenter", f"--net=/run/netns/{cluster.ns('c')}", "unshare", "--uts", "sh", "-c",
             "hostname ctl && exec slurmctld -D -i"],
        )  # fmt: skip
        for node in NODES:
            cluster.start_slurmd(node)
        wait_for("both nodes idle", lambda: all(cluster.node_state(n) == "idle" for n in NODES), timeout=60)
        budgets(cluster)
        yield cluster
    finally:
        cluster.stop()
        if not os.environ.get("RDC_SLURM_KEEP"):  # set it to read the daemons' and hooks' logs after a run
            shutil.rmtree(base, ignore_errors=True)


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
