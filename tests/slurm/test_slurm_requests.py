"""`rdc repo gpu request|leases|release`: leases asked for and ended from rdc, on the real cluster."""

from __future__ import annotations

import json

from slurm_kit import Cluster, wait_for

from rediacc_core.config import Config
from rediacc_core.grants.records import Grant, read_grants


def grants(cluster: Cluster, node: str) -> list[Grant]:
    return read_grants(Config.load(cluster.config_path).machine(node))


def rdc_ok(cluster: Cluster, *argv: str) -> str:
    done = cluster.rdc(*argv)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_request_runs_on_the_repos_node_waits_its_turn_and_a_release_ends_it(slurm: Cluster) -> None:
    for repo in ("alpha", "beta"):
        rdc_ok(slurm, "repo", "slurm", "allow", f"{repo}@n2", "--account", "teama")
    ask = ("--for", "10m", "--mem", "100M", "--account", "teama", "-o", "json")
    first = json.loads(rdc_ok(slurm, "repo", "gpu", "request", "alpha@n2", "--gres", "gpu:a100:2", *ask))
    assert first["repo"] == "alpha@n2"
    wait_for("alpha's grant", lambda: len(grants(slurm, "n2")) == 2)
    assert {g.job for g in grants(slurm, "n2")} == {f"slurm:rdcs/{first['job']}"}
    assert slurm.job(first["job"])["nodes"] == "n2"  # the repo's own node, though n1 is free
    second = json.loads(rdc_ok(slurm, "repo", "gpu", "request", "beta@n2", "--gres", "gpu:1", *ask))
    assert second["state"] == "PENDING"
    listed = json.loads(rdc_ok(slurm, "repo", "gpu", "leases", "beta@n2", "-o", "json"))["leases"]
    assert [(j["job"], j["state"]) for j in listed] == [(second["job"], "PENDING")]
    done = slurm.rdc("repo", "gpu", "release", "alpha@n2")
    assert done.returncode == 0, done.stderr
    assert "Revoked nvidia.com/gpu=0 from alpha@n2." in done.stderr
    wait_for("beta's grant", lambda: {g.job for g in grants(slurm, "n2")} == {f"slurm:rdcs/{second['job']}"})
    assert json.loads(rdc_ok(slurm, "repo", "gpu", "leases", "alpha@n2", "-o", "json"))["leases"] == []
