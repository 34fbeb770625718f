"""Slurm allocations become grants on the machine, and their end revokes them: a real slurmctld,
slurmdbd and two slurmds, the prolog and epilog run by slurmd as `rdc slurm prolog|epilog`."""

from __future__ import annotations

import json

from slurm_kit import UUIDS, Cluster, wait_for

from rediacc_core.config import Config
from rediacc_core.grants.records import Grant, read_grants
from rediacc_core.repos import RepoStore

XID_79 = (
    "[ 5123.456789] NVRM: Xid (PCI:0000:07:00): 79, pid=2411, name=python3, GPU has fallen off the bus.\n"
)


def grants(cluster: Cluster, node: str) -> list[Grant]:
    return read_grants(Config.load(cluster.config_path).machine(node))


def allow(cluster: Cluster, node: str, repo: str, *args: str) -> None:
    done = cluster.rdc("repo", "slurm", "allow", f"{repo}@{node}", *args)
    assert done.returncode == 0, done.stderr


def test_an_allocation_is_an_exclusive_grant_to_the_repo_until_the_job_ends(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    configured = slurm.rdc("machine", "config", "n1", "--set", "dcgm-job-mapping-dir=/run/dcgm-jobs")
    assert configured.returncode == 0, configured.stderr
    job = slurm.lease("alpha", node="n1")
    # dcgm-exporter's job mapping names the repo and the Slurm job on the card's metrics.
    assert (slurm.root("n1") / "run/dcgm-jobs/0").read_text() == f"{job}\nalpha\n"
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
    wait_for("the node to be idle", lambda: slurm.node_state("n1") == "idle")


def test_a_user_not_allowed_for_the_repo_is_refused_and_the_node_stays_up(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    # daemon's only account is teamb, which alpha does not list: naming the repo is not enough.
    job = slurm.lease("alpha", account="teamb", uid=1, node="n1")
    wait_for("the job to be cancelled", lambda: slurm.job_state(job) == "CANCELLED")
    assert "rdc: user daemon (account teamb) may not lease for repo alpha@n1" in slurm.admin_comment(job)
    assert grants(slurm, "n1") == []
    wait_for("the node to be idle again, never drained", lambda: slurm.node_state("n1") == "idle")


def test_a_job_for_a_repo_the_machine_does_not_have_is_refused(slurm: Cluster) -> None:
    job = slurm.lease("gamma", node="n1")
    wait_for("the job to be cancelled", lambda: slurm.job_state(job) == "CANCELLED")
    assert "rdc: no repo gamma on machine n1" in slurm.admin_comment(job)

    assert slurm.node_state("n1") == "idle"


def test_two_repos_ask_for_the_one_free_card_one_waits_without_a_grant(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    allow(slurm, "n1", "beta", "--account", "teama")
    first = slurm.lease("alpha", node="n1", gpus=2)
    second = slurm.lease("beta", node="n1", ready=False)
    wait_for("the second to pend", lambda: slurm.job_state(second) == "PENDING")
    machine = Config.load(slurm.config_path).machine("n1")
    beta = RepoStore(machine).get_by_label("beta")
    assert sorted(g.device for g in grants(slurm, "n1")) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert [g for g in grants(slurm, "n1") if g.repo_id == beta.id] == []
    slurm.slurm("scancel", first)
    wait_for("the second's grant", lambda: [g.repo_id for g in grants(slurm, "n1")] == [beta.id], timeout=60)
    assert grants(slurm, "n1")[0].job == f"slurm:rdcs/{second}"


def test_a_stale_gres_map_refuses_the_lease_and_drains_the_node_with_the_reason(slurm: Cluster) -> None:
    allow(slurm, "n2", "alpha", "--account", "teama")
    conf = slurm.root("n2") / "etc/slurm/gres.conf"
    kept = conf.read_text()
    conf.write_text(kept.replace("# rdc-generation:", "# rdc-generation: 0000"))
    try:
        job = slurm.lease("alpha", node="n2")
        wait_for("the job to be cancelled", lambda: slurm.job_state(job) == "CANCELLED")
        assert "gres map of n2 is stale" in slurm.admin_comment(job)
        assert "rdc slurm gres n2 --node n2" in slurm.admin_comment(job)
        assert grants(slurm, "n2") == []
        assert "drain" in slurm.node_state("n2")
        assert slurm.node_reason("n2").startswith("rdc: gres map of n2 is stale")
    finally:
        conf.write_text(kept)


def test_slurmd_killed_mid_lease_leaves_the_grant_to_the_reconciler(slurm: Cluster) -> None:
    allow(slurm, "n2", "alpha", "--account", "teama")
    job = slurm.lease("alpha", node="n2")
    assert [g.job for g in grants(slurm, "n2")] == [f"slurm:rdcs/{job}"]
    slurm.kill("slurmd-n2", 9)
    # The controller gives the node up after SlurmdTimeout and ends the job; no epilog runs.
    wait_for("the job to end", lambda: slurm.job_state(job) not in ("RUNNING", "COMPLETING"), timeout=60)
    assert len(grants(slurm, "n2")) == 1
    done = slurm.rdc("slurm", "reconcile", "n2", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert grants(slurm, "n2") == []
    assert [g["job"] for g in json.loads(done.stdout)["revoked"]] == [f"slurm:rdcs/{job}"]


def test_a_time_limit_moved_in_slurm_moves_the_grants_end(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    job = slurm.lease("alpha", node="n1", minutes=10)
    slurm.slurm("scontrol", "update", f"JobId={job}", "TimeLimit=30")
    end = slurm.job(job)["end_time"]
    assert isinstance(end, int)
    from rediacc_core.slurm.client import iso

    done = slurm.rdc("slurm", "reconcile", "n1", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert [(g["job"], g["until"]) for g in json.loads(done.stdout)["renewed"]] == [
        (f"slurm:rdcs/{job}", iso(end))
    ]
    assert [g.expires_at for g in grants(slurm, "n1")] == [iso(end)]


def test_a_team_over_its_gpu_minutes_does_not_start(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teamc")
    job = slurm.lease("alpha", account="teamc", ready=False)
    wait_for("the job to pend", lambda: slurm.job_state(job) == "PENDING")
    wait_for("the budget's reason", lambda: "GrpGRESMinutes" in str(slurm.job(job).get("state_reason")))
    assert grants(slurm, "n1") == [] and grants(slurm, "n2") == []
    listed = slurm.rdc("repo", "gpu", "leases", "alpha@n1", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    shown = json.loads(listed.stdout)
    assert [(j["job"], j["state"], j["reason"]) for j in shown["leases"]] == [
        (job, "PENDING", "AssocGrpGRESMinutes")
    ]
    teamc = next(b for b in shown["budgets"] if b["account"] == "teamc")
    assert (teamc["limitMinutes"], teamc["usedMinutes"], teamc["leftMinutes"]) == (0, 0, 0)
    assert "Warning: account teamc has used 0 of its 0 GPU minutes: its leases do not start" in listed.stderr


def test_a_lease_with_its_own_memory_leaves_the_second_gpu_usable_one_without_does_not(
    slurm: Cluster,
) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    allow(slurm, "n1", "beta", "--account", "teama")
    slurm.lease("alpha", node="n1")
    second = slurm.lease("beta", node="n1")
    assert slurm.job_state(second) == "RUNNING"
    assert sorted(g.device for g in grants(slurm, "n1")) == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    slurm.cancel_all()
    wait_for("the node to be idle", lambda: slurm.node_state("n1") == "idle")
    slurm.lease("alpha", node="n1", mem=None)  # the whole node's memory
    blocked = slurm.lease("beta", node="n1", ready=False)
    wait_for("the second to pend", lambda: slurm.job_state(blocked) == "PENDING")
    assert "Resources" in str(slurm.job(blocked)["state_reason"])


def test_an_unhealthy_card_drains_the_node_with_rdcs_reason_until_cleared(slurm: Cluster) -> None:

    allow(slurm, "n1", "alpha", "--account", "teama")
    log = slurm.root("n1") / "var/log/kern.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(XID_79)
    try:
        scanned = slurm.rdc("machine", "gpu", "list", "n1", "--scan")  # records the event, as a gate would
        assert scanned.returncode == 0, scanned.stderr
        job = slurm.lease("alpha", node="n1", gpus=2)
        wait_for("the job to be cancelled", lambda: slurm.job_state(job) == "CANCELLED")
        reason = f"rdc: {UUIDS['n1'][0]} held (xid-79)"
        assert slurm.admin_comment(job).startswith(reason)
        assert "drain" in slurm.node_state("n1") and slurm.node_reason("n1") == reason
        assert grants(slurm, "n1") == []
        cleared = slurm.rdc("machine", "gpu", "clear", "n1")
        assert cleared.returncode == 0, cleared.stderr
        assert "Slurm: resumed n1" in cleared.stderr
        wait_for("the node to be idle", lambda: slurm.node_state("n1") == "idle")
        # The same line read again stays cleared; `rdc slurm health` finds nothing to change.
        again = slurm.rdc("slurm", "health", "n1")
        assert again.returncode == 0 and "nothing to change" in again.stderr
        # A new event: `rdc slurm health` reads it and drains the node itself, with no job asking.
        with log.open("a") as more:
            more.write(XID_79.replace("5123.456789", "6001.000100"))
        drained = slurm.rdc("slurm", "health", "n1")
        assert f"Slurm: drained n1: {reason}" in drained.stderr
        assert slurm.node_reason("n1") == reason
    finally:
        log.unlink()
        slurm.rdc("machine", "gpu", "clear", "n1")


def test_a_preempted_lease_is_revoked_before_the_preemptor_is_granted(slurm: Cluster) -> None:
    allow(slurm, "n1", "alpha", "--account", "teama")
    allow(slurm, "n1", "beta", "--account", "teama")
    first = slurm.lease("alpha", node="n1", gpus=2)
    machine = Config.load(slurm.config_path).machine("n1")
    beta = RepoStore(machine).get_by_label("beta")
    second = slurm.lease("beta", node="n1", gpus=2, extra=["--qos=urgent"])
    # Slurm cancels the first (PreemptMode=CANCEL), its epilog revokes, then the second's prolog grants.
    assert slurm.job_state(first) in ("PREEMPTED", "CANCELLED")
    assert {(g.repo_id, g.job) for g in grants(slurm, "n1")} == {(beta.id, f"slurm:rdcs/{second}")}


def test_a_requeued_batch_lease_is_revoked_at_preemption_before_the_preemptor_is_granted(
    slurm: Cluster,
) -> None:
    """PreemptMode=REQUEUE (the `spare` QOS): the preempted job's epilog revokes, as at any end, and
    the job waits in the queue with no grant. (Only a batch job can be requeued: an `salloc` lease,
    as `rdc repo gpu request` makes, preempted so is cancelled, as under PreemptMode=CANCEL.)"""
    allow(slurm, "n1", "alpha", "--account", "teama")
    allow(slurm, "n1", "beta", "--account", "teama")
    machine = Config.load(slurm.config_path).machine("n1")
    alpha, beta = (RepoStore(machine).get_by_label(name) for name in ("alpha", "beta"))
    submitted = slurm.slurm(
        "sbatch", "--parsable", "--requeue", "--qos=spare", "--account=teama", "--gres=gpu:2", "--mem=100",
        "--cpus-per-task=1", "--time=10", "--nodelist=n1", "--comment=rdc-repo=alpha",
        "--output=/dev/null", "--wrap=sleep 600",
    )  # fmt: skip
    first = submitted.stdout.strip().split(";")[0]
    wait_for("alpha's grant", lambda: {g.repo_id for g in grants(slurm, "n1")} == {alpha.id}, timeout=60)
    second = slurm.lease("beta", node="n1", gpus=2, extra=["--qos=urgent"])
    assert {(g.repo_id, g.job) for g in grants(slurm, "n1")} == {(beta.id, f"slurm:rdcs/{second}")}
    assert slurm.job_state(first) in ("PENDING", "REQUEUED", "PREEMPTED")  # requeued: waiting to begin
