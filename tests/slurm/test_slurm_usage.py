"""GPU hours per repo from Slurm's accounting: a lease's elapsed seconds times its GPUs, counted for
the repo its comment names on the node it ran on, never for a job rdc refused; shown by `rdc repo
gpu leases` and written by the gates' Slurm round beside their counters."""

from __future__ import annotations

import json
import time
from typing import Any

from slurm_kit import Cluster, wait_for

from rediacc_core.config import Config
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.serve import log_keeper
from rediacc_core.slurm.round import round_paths
from rediacc_core.slurm.usage import METRIC, metrics_path


def used(cluster: Cluster, ref: str) -> dict[str, Any]:
    done = cluster.rdc("repo", "gpu", "leases", ref, "-o", "json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)["used"]
    return found


def elapsed(cluster: Cluster, job: str) -> int:
    return int(cluster.slurm("sacct", "-n", "-X", "-P", "-o", "ElapsedRaw", "-j", job).stdout.strip())


def test_a_leases_gpu_seconds_count_for_its_repo_and_a_refused_jobs_do_not(slurm: Cluster) -> None:
    assert slurm.rdc("repo", "slurm", "allow", "alpha@n1", "--account", "teama").returncode == 0
    before = used(slurm, "alpha@n1")
    job = slurm.lease("alpha", node="n1", gpus=2)
    wait_for("the job to run", lambda: slurm.job_state(job) == "RUNNING")
    time.sleep(2)
    slurm.slurm("scancel", job)
    wait_for("the job to end", lambda: slurm.job_state(job) not in ("RUNNING", "COMPLETING"))
    refused = slurm.lease("alpha", node="n1", account="teamb", uid=1)  # daemon, of teamb only
    wait_for("the refusal", lambda: slurm.job_state(refused) not in ("PENDING", "RUNNING", "COMPLETING"))
    after = used(slurm, "alpha@n1")
    assert job in after["jobs"] and refused not in after["jobs"]
    assert after["gpuSeconds"] - before["gpuSeconds"] == 2 * elapsed(slurm, job) >= 4
    assert after["since"].endswith("-01T00:00:00Z")
    # Fair share beside the budget: teama is one of four equal shares (root's own, teama, b and c).
    budgets = json.loads(slurm.rdc("repo", "gpu", "leases", "alpha@n1", "-o", "json").stdout)["budgets"]
    teama = next(b for b in budgets if b["account"] == "teama")
    assert teama["share"] == 0.25 and 0.0 <= teama["shareUsed"] <= 1.0
    # The table's words, and another repo of the node has none of it.
    table = slurm.rdc("repo", "gpu", "leases", "alpha@n1")
    assert "alpha@n1's leases on this node since" in table.stderr and "GPU hours in" in table.stderr
    assert job not in used(slurm, "beta@n1")["jobs"]

    # The gates' Slurm round writes every repo's seconds for node_exporter beside their counters.
    machine = Config.load(slurm.config_path).machine("n1")
    repos = {r.name: r for r in RepoStore(machine).list()}
    round_paths(machine)[1].unlink(missing_ok=True)
    log_keeper(machine, repos["alpha"], print).check()
    text = metrics_path(machine).read_text()
    assert f'{METRIC}{{repo_id="{repos["alpha"].id}",repo="alpha"}} {after["gpuSeconds"]}\n' in text
    assert 'repo="beta"} ' in text
