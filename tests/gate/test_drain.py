"""While a repo is being emptied for a handover (`grants.release`: its drain mark in the grants file),
its gate refuses every request that would make a process run: start, restart, unpause, exec, builds
(classic and BuildKit's), whatever the container names. Reads and stops pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rediacc_core.gate.policy.endpoints import resolve
from rediacc_core.gate.server import GateServer
from rediacc_core.grants.records import Drain, write_grants
from rediacc_core.statelock import state_lock

Gate = Any  # tests/gate/conftest.py's Gate: the decider on a simulated machine

WHY = "vendor.example/gpu=0 is being handed over to repo beta@m1"


def drain(gate: Gate, until: str) -> None:
    machine = gate.fm.machine
    with state_lock(machine):
        write_grants(machine, [], drains=[Drain(gate.decider.repo.id, "2026-01-01T00:00:00Z", until, WHY)])


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("POST", "/v1.45/containers/c1/start"),
        ("POST", "/v1.45/containers/c1/restart"),
        ("POST", "/v1.45/containers/c1/unpause"),
        ("POST", "/v1.45/containers/c1/exec"),
        ("POST", "/v1.45/exec/e1/start"),
        ("POST", "/v1.45/build"),
        ("POST", "/v1.45/grpc"),
        ("POST", "/session"),
    ],
)
def test_nothing_of_the_repo_may_run_while_it_is_emptied(gate: Gate, method: str, target: str) -> None:
    drain(gate, "2999-01-01T00:00:00Z")
    refused = gate.decider.head(resolve(method, target)) or gate.post(target, method=method)
    assert not refused.forward and refused.status == 403
    assert f"repo alpha is being emptied: {WHY}" in refused.message
    assert "until that is done" in refused.message


@pytest.mark.parametrize("target", ["/v1.45/grpc", "/session", "/v1.45/containers/c1/start", "/v1.45/build"])
def test_a_drain_reaches_a_target_the_gate_has_seen_before_and_lifts_from_it(
    gate: Gate, tmp_path: Path, target: str
) -> None:
    # The server remembers what a head decided for a target; what the drain mark governs must
    # be asked every time, both ways: a drain refuses a target passed before, and once lifted,
    # a target refused during the drain passes again.
    server = GateServer(tmp_path / "listen.sock", tmp_path / "daemon.sock", gate.decider)
    assert server.route("POST", target)[0] is None
    drain(gate, "2999-01-01T00:00:00Z")
    refused, _ = server.route("POST", target)
    assert refused is not None and "is being emptied" in refused.message
    drain(gate, "2026-01-01T00:00:01Z")  # past its bound: holds nothing
    assert server.route("POST", target)[0] is None


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/v1.45/containers/json"),
        ("POST", "/v1.45/containers/c1/stop"),
        ("POST", "/v1.45/containers/c1/kill"),
    ],
)
def test_reads_and_stops_pass(gate: Gate, method: str, target: str) -> None:
    drain(gate, "2999-01-01T00:00:00Z")
    assert gate.decider.head(resolve(method, target)) is None


def test_a_drain_past_its_bound_holds_nothing(gate: Gate) -> None:
    drain(gate, "2001-01-01T00:00:00Z")
    assert gate.decider.head(resolve("POST", "/v1.45/containers/c1/start")) is None
