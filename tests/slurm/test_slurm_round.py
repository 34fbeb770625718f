"""Slurm in the gates' housekeeping round: the gate's chores (`runtime.serve.log_keeper`, with rdc's
own Slurm plugin among the plugins, `slurm.plugin`) revoke a grant whose job died with its node and drain
the node for a card held back, with no timer; several gates of one machine run it once a round."""

from __future__ import annotations

from pathlib import Path

from slurm_kit import UUIDS, Cluster, wait_for

from rediacc_core.bindings import VANISHED, Suspension
from rediacc_core.config import Config
from rediacc_core.grants.records import Grant, read_grants, write_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.serve import log_keeper
from rediacc_core.slurm.gres import read_map
from rediacc_core.slurm.round import round_paths, slurm_round

# A time of its own: an event once cleared stays cleared, and the leases suite reads its own line.
XID_79 = (
    "[ 7204.000001] NVRM: Xid (PCI:0000:07:00): 79, pid=2411, name=python3, GPU has fallen off the bus.\n"
)


def node(cluster: Cluster, name: str) -> tuple[Machine, dict[str, Repo]]:
    machine = Config.load(cluster.config_path).machine(name)
    return machine, {r.name: r for r in RepoStore(machine).list()}


def housekeeping(machine: Machine, repo: Repo) -> list[str]:
    """One round of the repo gate's housekeeping; the lines it logged."""
    said: list[str] = []
    keeper = log_keeper(machine, repo, said.append)
    keeper.check()
    return said


def test_a_grant_whose_job_died_with_its_node_is_revoked_in_the_next_round(slurm: Cluster) -> None:
    done = slurm.rdc("repo", "slurm", "allow", "alpha@n2", "--account", "teama")
    assert done.returncode == 0, done.stderr
    job = slurm.lease("alpha", node="n2")
    machine, repos = node(slurm, "n2")
    assert [g.job for g in read_grants(machine)] == [f"slurm:rdcs/{job}"]
    slurm.kill("slurmd-n2", 9)
    wait_for("the job to end", lambda: slurm.job_state(job) not in ("RUNNING", "COMPLETING"), timeout=60)
    round_paths(machine)[1].unlink(missing_ok=True)
    said = housekeeping(machine, repos["alpha"])
    assert read_grants(machine) == []
    assert any("Slurm: revoked" in line and f"slurm:rdcs/{job}" in line for line in said), said


def test_the_gates_of_one_machine_run_the_round_once_and_a_held_card_drains_the_node(
    slurm: Cluster,
) -> None:
    machine, repos = node(slurm, "n1")
    kern = slurm.root("n1") / "var/log/kern.log"
    kern.parent.mkdir(parents=True, exist_ok=True)
    kern.write_text(XID_79)
    lock, stamp = round_paths(machine)
    stamp.unlink(missing_ok=True)
    try:
        first = housekeeping(machine, repos["alpha"])
        reason = f"rdc: {UUIDS['n1'][0]} held (xid-79)"
        assert f"Slurm: drained n1: {reason}" in first, first
        assert "drain" in slurm.node_state("n1") and slurm.node_reason("n1") == reason
        # A second repo's gate in the same round leaves Slurm alone: the node is not asked again.
        # (Within seconds of the first: the round's stamp is 25 s old at most.)
        slurm.resume("n1")
        assert not any(line.startswith("Slurm:") for line in housekeeping(machine, repos["beta"]))
        assert "drain" not in slurm.node_state("n1")
        # The next round (its stamp old) drains it again: the card is still held back.
        stamp.write_text("0\n")
        assert f"Slurm: drained n1: {reason}" in housekeeping(machine, repos["beta"])
        assert lock.exists()
    finally:
        kern.unlink()
        slurm.rdc("machine", "gpu", "clear", "n1")


def test_a_machine_that_is_no_slurm_node_never_calls_slurm(tmp_path: Path) -> None:
    machine = Machine("plain", tmp_path)  # no gres map: not a Slurm node, and no Slurm CLI either
    repo = RepoStore(machine).create("alpha")
    assert slurm_round(machine, repo.id, print) is False
    assert not round_paths(machine)[0].parent.exists()


def suspend(machine: Machine, repo: Repo, device: str) -> None:
    """A grant of `device` as setup's re-check leaves it when the name reaches another card."""
    drifted = Suspension(VANISHED, "the card granted is gone (GPU-0ld…)", "2026-01-01T00:00:00Z")
    write_grants(machine, [Grant(repo.id, device, True, "2026-01-01T00:00:00Z", suspended=drifted)])


def test_a_grant_suspended_for_drift_drains_the_node_until_confirmed_or_revoked(slurm: Cluster) -> None:
    machine, repos = node(slurm, "n1")
    found = read_map(machine)
    assert found is not None
    card = found.entries[0]
    reason = f"rdc: {card.uuid} suspended (vanished)"
    suspend(machine, repos["alpha"], card.cdi)
    round_paths(machine)[1].unlink(missing_ok=True)
    assert f"Slurm: drained n1: {reason}" in housekeeping(machine, repos["alpha"])
    assert "drain" in slurm.node_state("n1") and slurm.node_reason("n1") == reason
    confirmed = slurm.rdc("repo", "gpu", "confirm", "alpha@n1", "--device", card.cdi)
    assert confirmed.returncode == 0, confirmed.stderr
    assert "Slurm: resumed n1" in confirmed.stderr
    wait_for("the node to be idle", lambda: slurm.node_state("n1") == "idle")
    # Suspended again (setup drains it so too, `slurm.follow.after_setup`); a revoke resumes it.
    suspend(machine, repos["alpha"], card.cdi)
    drained = slurm.rdc("slurm", "health", "n1")
    assert f"Slurm: drained n1: {reason}" in drained.stderr, drained.stderr
    revoked = slurm.rdc("repo", "gpu", "revoke", "alpha@n1", "--device", card.cdi)
    assert revoked.returncode == 0, revoked.stderr
    assert "Slurm: resumed n1" in revoked.stderr
    wait_for("the node to be idle", lambda: slurm.node_state("n1") == "idle")


def test_an_operators_drain_is_not_lifted_when_no_grant_is_suspended(slurm: Cluster) -> None:
    machine, repos = node(slurm, "n1")
    slurm.slurm("scontrol", "update", "NodeName=n1", "State=DRAIN", "Reason=maintenance")
    suspend(machine, repos["alpha"], "no.such/gpu=9")  # no card of the node: nothing to drain for
    revoked = slurm.rdc("repo", "gpu", "revoke", "alpha@n1", "--device", "no.such/gpu=9")
    assert revoked.returncode == 0, revoked.stderr
    assert "drain" in slurm.node_state("n1") and slurm.node_reason("n1") == "maintenance"
