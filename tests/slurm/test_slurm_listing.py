"""A repo's Slurm leases in the listings: `rdc repo gpu list` names them with the budget warnings of
`rdc repo gpu leases`, `rdc repo list` (and `--all`) has a LEASES column and a `leases` field; a
Slurm that does not answer is said in a line and never fails the listing."""

from __future__ import annotations

import json

from slurm_kit import Cluster, wait_for


def rdc_ok(cluster: Cluster, *argv: str) -> tuple[str, str]:
    done = cluster.rdc(*argv)
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def test_the_listings_show_a_repos_running_and_pending_leases_and_the_budget_warning(slurm: Cluster) -> None:
    rdc_ok(slurm, "repo", "slurm", "allow", "alpha@n1", "--account", "teama")
    rdc_ok(slurm, "repo", "slurm", "allow", "alpha@n1", "--account", "teamc")
    running = slurm.lease("alpha", node="n1")
    pending = slurm.lease("alpha", account="teamc", ready=False)
    wait_for("the budget's reason", lambda: "GrpGRESMinutes" in str(slurm.job(pending).get("state_reason")))

    _, said = rdc_ok(slurm, "repo", "gpu", "list", "alpha@n1")
    assert f"Slurm lease of alpha@n1: job {running} RUNNING until " in said
    assert f"Slurm lease of alpha@n1: job {pending} PENDING (AssocGrpGRESMinutes)" in said
    assert "Warning: account teamc has used 0 of its 0 GPU minutes: its leases do not start" in said

    out, _ = rdc_ok(slurm, "repo", "list", "n1", "-o", "json")
    by_name = {r["ref"]: r for r in json.loads(out)}
    assert [(j["job"], j["state"]) for j in by_name["alpha@n1"]["leases"]] == [
        (running, "RUNNING"),
        (pending, "PENDING"),
    ] or [(j["job"], j["state"]) for j in by_name["alpha@n1"]["leases"]] == [
        (pending, "PENDING"),
        (running, "RUNNING"),
    ]
    assert by_name["beta@n1"]["leases"] == []
    table, _ = rdc_ok(slurm, "repo", "list", "n1")
    assert "LEASES" in table.splitlines()[0] and f"{running} RUNNING until" in table

    every, _ = rdc_ok(slurm, "repo", "list", "--all")
    assert "LEASES" in every.splitlines()[0]
    assert f"{running} RUNNING until" in every and f"{pending} PENDING (AssocGrpGRESMinutes)" in every


def test_a_slurm_that_does_not_answer_leaves_the_listings_standing(slurm: Cluster) -> None:
    squeue = slurm.root("n1") / "usr/bin/squeue"
    kept = squeue.read_text()
    down = "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2"
    squeue.write_text(f"#!/bin/sh\n{down}\nexit 1\n")
    try:
        _, said = rdc_ok(slurm, "repo", "gpu", "list", "alpha@n1")
        assert "Slurm leases not shown (n1): `squeue" in said
        table, said = rdc_ok(slurm, "repo", "list", "n1")
        assert "alpha@n1" in table and "LEASES" not in table
        assert "Slurm leases not shown (n1)" in said
    finally:
        squeue.write_text(kept)
