"""Slurm allocations become grants on the machine, and their end revokes them: a real slurmctld,
slurmdbd and two slurmds, the prolog and epilog run by slurmd as `rdc slurm prolog|epilog`."""

from __future__ import annotations

from slurm_kit import Cluster, wait_for

from rediacc_core.config import Config
from rediacc_core.grants.records import Grant, read_grants
from rediacc_core.repos import RepoStore


def grants(cluster: Cluster, node: str) -> list[Grant]:
    return read_grants(Config.load(cluster.config_path).machine(node))


def allow(cluster: Cluster, node: str, repo: str, *args: str) -> None:
    done = cluster.rdc("repo", "slurm", "allow", f"{repo}@{node}", *args)
    assert done.returncode == 0, done.stderr


def test_an_allocation_is_an_exclusive_grant_to_the_repo_until_the_job_ends(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    job = slurm.lease("alpha", node="n1")
    wait_for("the job to run", lambda: slurm.job_state(job) == "RUNNING")
    machine = Config.load(slurm.config_path).machine("n1")
    alpha = RepoStore(machine).get_by_label("alpha")
    held = grants(slurm, "n1")
    assert [(g.repo_id, g.device, g.exclusive, g.job) for g in held] == [
        (alpha.id, "nvidia.com/gpu=0", True, f"slurm:rdcs/{job}")
    ]
    end = slurm.job(job)["end_time"]
    assert isinstance(end, int)
    from rediacc_core.slurm.client import iso

    assert held[0].expires_at == iso(end)


def test_scancel_runs_the_epilog_which_revokes_the_grant(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    job = slurm.lease("alpha", node="n1")
    wait_for("the grant", lambda: len(grants(slurm, "n1")) == 1)
    slurm.slurm("scancel", job)
    wait_for("the epilog's revoke", lambda: grants(slurm, "n1") == [])
    assert slurm.node_state("n1") == "idle"
