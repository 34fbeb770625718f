"""External mode on a real Slurm 26.05: the boxes are State=EXTERNAL nodes with no slurmd, leases are
external jobs (`rdc repo gpu request --external`), and `rdc slurm bridge` makes each running one a
grant on its box and revokes it once the job has ended. A box reached over SSH (box x2 added a second
time, as `x2s`, served by a real sshd on this host) has its step (`rdc slurm bridge-step`) run
through its rdc-agent, and what the step refused is cancelled from the operator's host."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from slurm_ext_kit import NODES, machine
from slurm_kit import Cluster, wait_for
from ssh_kit import install_agent

from rediacc_core.config import Config
from rediacc_core.grants.records import Grant, read_grants
from rediacc_core.machine import Machine
from rediacc_core.testing.sshd import running_sshd, sshd_unavailable


def request(slurm: Cluster, repo: str, account: str = "teama", *extra: str, lasting: str = "5m") -> str:
    done = ask(slurm, repo, account, *extra, lasting=lasting)
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["job"])


def ask(slurm: Cluster, repo: str, account: str, *extra: str, lasting: str = "5m") -> CompletedProcess[str]:
    """`rdc repo gpu request` of one GPU for `repo` in external mode, `extra` its further options."""
    return slurm.rdc(
        "repo", "gpu", "request", repo, "--gres", "gpu:1", "--for", lasting, "--mem", "100M",
        "--account", account, "--external", "ops", "-o", "json", *extra,
    )  # fmt: skip


def bridge(slurm: Cluster) -> list[str]:
    """One round of the bridge over every box; the lines it said."""
    done = slurm.rdc("slurm", "bridge", *NODES, "--slurm", "ops", "--once")
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("rdc:")]


def grants_of(slurm: Cluster, node: str, job_id: str) -> list[Grant]:
    return [g for g in read_grants(machine(slurm, node)) if g.job == f"slurm:rdcs/{job_id}"]


def allow(slurm: Cluster, repo: str, account: str) -> None:
    done = slurm.rdc("repo", "slurm", "allow", repo, "--account", account)
    assert done.returncode == 0, done.stderr


def running(slurm: Cluster, job_id: str) -> None:
    wait_for(f"job {job_id} to run", lambda: slurm.job_state(job_id) == "RUNNING")


def test_two_repos_queue_for_the_one_free_card(slurm: Cluster) -> None:
    allow(slurm, "alpha@x1", "teama")
    allow(slurm, "beta@x1", "teama")
    # A job of no repo's holds one of x1's two cards in Slurm's count: one card is left.
    filler = slurm.slurm(
        "sbatch", "--external", "--parsable", "--gres=gpu:1", "--nodelist=x1", "--account=teama",
        "--mem=100", "--time=5",
    ).stdout.strip()  # fmt: skip
    running(slurm, filler)
    first = request(slurm, "alpha@x1")
    running(slurm, first)
    second = request(slurm, "beta@x1")
    assert slurm.job_state(second) == "PENDING"

    said = bridge(slurm)
    (granted,) = grants_of(slurm, "x1", first)
    assert granted.device == "nvidia.com/gpu=0" and granted.exclusive, said
    assert grants_of(slurm, "x1", second) == []
    assert slurm.job_state(second) == "PENDING"

    slurm.slurm("scancel", first)
    running(slurm, second)
    said = bridge(slurm)
    assert grants_of(slurm, "x1", first) == [], said
    (granted,) = grants_of(slurm, "x1", second)
    assert granted.device == "nvidia.com/gpu=0", said
    assert granted.expires_at == slurm_end(slurm, second)


def slurm_end(slurm: Cluster, job_id: str) -> str:
    from rediacc_core.slurm.client import iso

    end = slurm.job(job_id)["end_time"]
    assert isinstance(end, dict)
    return iso(int(end["number"]))


def test_scancel_revokes_the_grant(slurm: Cluster) -> None:
    allow(slurm, "alpha@x2", "teama")
    job = request(slurm, "alpha@x2")
    running(slurm, job)
    bridge(slurm)
    assert [g.device for g in grants_of(slurm, "x2", job)] == ["nvidia.com/gpu=0"]
    slurm.slurm("scancel", job)
    wait_for("the job to end", lambda: slurm.job_state(job) not in ("RUNNING", "COMPLETING"))
    said = bridge(slurm)
    assert grants_of(slurm, "x2", job) == []
    assert said == [f"rdc: job slurm:rdcs/{job}: revoked nvidia.com/gpu=0 from alpha@x2"]


def test_a_job_of_an_account_not_allowed_for_the_repo_is_cancelled_with_the_reason(slurm: Cluster) -> None:
    allow(slurm, "alpha@x3", "teama")
    job = request(slurm, "alpha@x3", account="teamb")
    running(slurm, job)
    said = bridge(slurm)
    assert any(f"job slurm:rdcs/{job} refused" in line for line in said), said
    assert read_grants(machine(slurm, "x3")) == []
    wait_for("the job to be cancelled", lambda: slurm.job_state(job) == "CANCELLED")
    assert "may not lease for repo alpha@x3" in slurm.admin_comment(job)
    # A later round neither grants it nor cancels it again.
    assert bridge(slurm) == []


def test_an_account_without_gpu_minutes_does_not_start(slurm: Cluster) -> None:
    allow(slurm, "alpha@x1", "teamc")
    job = request(slurm, "alpha@x1", account="teamc")
    wait_for(
        "Slurm to hold the job for its budget",
        lambda: str(slurm.job(job).get("state_reason")) == "AssocGrpGRESMinutes",
    )
    assert bridge(slurm) == []
    assert slurm.job_state(job) == "PENDING"
    assert read_grants(machine(slurm, "x1")) == []


def test_release_cancels_the_lease_and_revokes_on_its_own_box_only(slurm: Cluster) -> None:
    allow(slurm, "alpha@x2", "teama")
    allow(slurm, "alpha@x3", "teama")
    mine, other = request(slurm, "alpha@x2"), request(slurm, "alpha@x3")
    running(slurm, mine)
    running(slurm, other)
    bridge(slurm)
    shown = slurm.rdc("repo", "gpu", "leases", "alpha@x2", "--external", "ops", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert [(row["job"], row["state"]) for row in json.loads(shown.stdout)["leases"]] == [(mine, "RUNNING")]

    done = slurm.rdc("repo", "gpu", "release", "alpha@x2", "--external", "ops")
    assert done.returncode == 0, done.stderr
    assert "Revoked nvidia.com/gpu=0 from alpha@x2" in done.stderr
    assert grants_of(slurm, "x2", mine) == []
    wait_for("the lease to be cancelled", lambda: slurm.job_state(mine) == "CANCELLED")
    # alpha on x3 is another repo of the same name: its lease and grant stay.
    assert slurm.job_state(other) == "RUNNING"
    assert [g.device for g in grants_of(slurm, "x3", other)] == ["nvidia.com/gpu=0"]
    assert bridge(slurm) == []


def test_a_moved_time_limit_moves_the_grants_end(slurm: Cluster) -> None:
    allow(slurm, "beta@x3", "teama")
    job = request(slurm, "beta@x3")
    running(slurm, job)
    bridge(slurm)
    (before,) = grants_of(slurm, "x3", job)
    slurm.slurm("scontrol", "update", f"JobId={job}", "TimeLimit=9")
    moved = slurm_end(slurm, job)
    assert moved != before.expires_at
    said = bridge(slurm)
    (after,) = grants_of(slurm, "x3", job)
    assert (after.device, after.expires_at) == (before.device, moved), said
    assert said == [f"rdc: job slurm:rdcs/{job}: renewed nvidia.com/gpu=0 until {moved}"]


def test_a_teams_gpu_reservation_runs_its_accounts_lease_and_keeps_out_anothers(slurm: Cluster) -> None:
    # Slurm 26.05 takes `TRES=gres/gpu=N` (not a typed `gres/gpu:a100=N`: "Invalid Trackable RESource")
    # and, on a node named, reserves all its cores beside the cards: the node is the team's meanwhile.
    # (Every lease here is root's, and Slurm lets its SlurmUser into any reservation: team A's lease
    # is kept out by asking for none.)
    slurm.slurm(
        "scontrol", "create", "reservation", "ReservationName=teamb-gpu", "StartTime=now", "Duration=60",
        "Nodes=x1", "TRES=gres/gpu=1", "Accounts=teamb",
    )  # fmt: skip
    try:
        allow(slurm, "alpha@x1", "teamb")
        allow(slurm, "beta@x1", "teama")
        reserved = request(slurm, "alpha@x1", "teamb", "--reservation", "teamb-gpu")
        other = request(slurm, "beta@x1", "teama")
        running(slurm, reserved)
        said = bridge(slurm)
        assert [g.device for g in grants_of(slurm, "x1", reserved)] == ["nvidia.com/gpu=0"], said
        assert said == [f"rdc: job slurm:rdcs/{reserved}: granted nvidia.com/gpu=0 to alpha@x1"]
        # Slurm has looked at it (Resources: the node's cores are the reservation's) and holds it.
        wait_for(
            "Slurm to hold team A's lease", lambda: slurm.job(other).get("state_reason") not in (None, "None")
        )
        assert slurm.job_state(other) == "PENDING"
        assert bridge(slurm) == []
        assert grants_of(slurm, "x1", other) == []
    finally:
        slurm.cancel_all()
        slurm.slurm("scontrol", "delete", "ReservationName=teamb-gpu")


def test_a_lease_that_reaches_its_time_limit_leaves_its_box_with_no_grant(slurm: Cluster) -> None:
    allow(slurm, "beta@x2", "teama")
    job = request(slurm, "beta@x2", lasting="1m")  # Slurm's shortest: its limits are whole minutes
    running(slurm, job)
    bridge(slurm)
    (granted,) = grants_of(slurm, "x2", job)
    assert granted.expires_at == slurm_end(slurm, job)
    # The grant lapses at the job's end by itself; slurmctld looks at time limits only every 30 s,
    # so the job may still be RUNNING in squeue then: a round must not grant it again.
    end = datetime.strptime(granted.expires_at, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    time.sleep(max(0.0, (end - datetime.now(UTC)).total_seconds()) + 1)
    assert grants_of(slurm, "x2", job) == []
    said = bridge(slurm)
    assert grants_of(slurm, "x2", job) == [], said
    assert not any("granted" in line for line in said), said
    wait_for(
        "Slurm to end the job at its limit", lambda: slurm.job_state(job) == "TIMEOUT", timeout=60, every=2
    )
    assert bridge(slurm) == []
    assert grants_of(slurm, "x2", job) == []


@pytest.fixture
def over_ssh(slurm: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of box x2 as an SSH machine of the operator's config."""
    reason = sshd_unavailable()
    if reason is not None:
        pytest.skip(reason)
    # Short: master sockets live there. No resident agent: none outlives the test.
    monkeypatch.setenv("RDC_SSH_CONTROL_DIR", tempfile.mkdtemp(prefix="rdc-x-", dir="/tmp"))
    monkeypatch.setenv("RDC_AGENT_IDLE", "0")
    root = slurm.root("x2")
    install_agent(root)
    with running_sshd(tmp_path / "sshd") as server:
        key = server.authorize("x2s", Machine(name="x2", root=root).tool_dir)
        added = slurm.rdc(
            "machine", "add", "x2s", "--ssh", server.address, "--root", str(root),
            "--identity", str(key), "--accept-host-key",
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
        try:
            yield "x2s"
        finally:
            config = Config.load(slurm.config_path)
            config.remove("x2s")
            config.save()


def bridge_named(slurm: Cluster, *boxes: str) -> tuple[list[str], str]:
    """One round over `boxes`: the lines it said, and all it wrote on stderr."""
    done = slurm.rdc("slurm", "bridge", *boxes, "--slurm", "ops", "--once")
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("rdc:")], done.stderr


def test_a_box_over_ssh_is_granted_revoked_and_its_refusal_cancelled_from_the_operators_host(
    slurm: Cluster, over_ssh: str
) -> None:
    # The box's own files over SSH: its map, and its repos' lists.
    shown = slurm.rdc("slurm", "gres", over_ssh, "--node", "x2", "--dry-run", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["slurmConf"].startswith("NodeName=x2 ")
    allow(slurm, "alpha@x2s", "teama")
    allow(slurm, "beta@x2s", "teama")
    leased = request(slurm, "alpha@x2")
    refused = request(slurm, "beta@x2", account="teamb")
    running(slurm, leased)
    running(slurm, refused)

    said, stderr = bridge_named(slurm, "x1", over_ssh, "x3")
    assert "its node over SSH (x2s)" in stderr
    assert [g.device for g in grants_of(slurm, "x2", leased)] == ["nvidia.com/gpu=0"], stderr
    assert f"rdc: job slurm:rdcs/{leased}: granted nvidia.com/gpu=0 to alpha@x2s" in said
    assert any(line.startswith(f"rdc: job slurm:rdcs/{refused} refused") for line in said), said
    wait_for("the refused job to be cancelled", lambda: slurm.job_state(refused) == "CANCELLED")
    assert "may not lease for repo beta@x2s" in slurm.admin_comment(refused)
    assert grants_of(slurm, "x2", refused) == []

    slurm.slurm("scancel", leased)
    wait_for("the job to end", lambda: slurm.job_state(leased) not in ("RUNNING", "COMPLETING"))
    said, stderr = bridge_named(slurm, over_ssh)
    assert said == [f"rdc: job slurm:rdcs/{leased}: revoked nvidia.com/gpu=0 from alpha@x2s"], stderr
    assert grants_of(slurm, "x2", leased) == []


def test_a_box_over_ssh_that_does_not_answer_fails_the_round_but_not_the_other_boxes(
    slurm: Cluster, over_ssh: str
) -> None:
    allow(slurm, "alpha@x1", "teama")
    job = request(slurm, "alpha@x1")
    running(slurm, job)
    agent = slurm.root("x2") / "opt/rediacc/bin/rdc-agent"
    agent.unlink()
    try:
        done = slurm.rdc("slurm", "bridge", over_ssh, "x1", "--slurm", "ops", "--once")
    finally:
        install_agent(slurm.root("x2"))
    assert done.returncode != 0
    assert f"rdc: job slurm:rdcs/{job}: granted nvidia.com/gpu=0 to alpha@x1" in done.stderr
    assert "the bridge reached not every box: x2s: rdc is not installed on machine x2s" in done.stderr
    assert "(install it: rdc machine install x2s)" in done.stderr
    assert [g.device for g in grants_of(slurm, "x1", job)] == ["nvidia.com/gpu=0"]
