"""A grant holds over a container's whole life: every request that makes a container run is checked
against what the container holds and the grants in force now, not only its create."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from rediacc_core.bindings import MOVED, Suspension
from rediacc_core.gate.decide.containers import Container, LookupFailed
from rediacc_core.grants.records import Grant, write_grants

Gate = Any  # tests/gate/conftest.py's Gate: the decider on a simulated machine
REF = "alpha@m1"
GPU0 = "vendor.example/gpu=0"
GPU1 = "vendor.example/gpu=1"


@dataclass
class FakeContainers:
    """The daemon's containers (by id and name) and exec instances, as the gate's lookup sees them."""

    containers: dict[str, Container] = field(default_factory=dict)
    execs: dict[str, str] = field(default_factory=dict)
    failing: bool = False
    asked: list[str] = field(default_factory=list)

    def add(self, ident: str, name: str, *cdi: str) -> None:
        held = Container(ident, name, tuple(cdi))
        self.containers[ident] = self.containers[name] = held

    def lookup(self, ref: str) -> Container | None:
        self.asked.append(ref)
        if self.failing:
            raise LookupFailed("the repo's daemon did not answer (timed out)")
        return self.containers.get(ref)

    def exec_container(self, exec_id: str) -> str | None:
        self.asked.append(f"exec:{exec_id}")
        return self.execs.get(exec_id)


@pytest.fixture
def containers(gate: Gate) -> FakeContainers:
    fake = FakeContainers()
    gate.rebuild(containers=fake)
    fake.add("c1" * 32, "trainer", GPU0)
    fake.add("c2" * 32, "plain")
    fake.execs["e1"] = "c1" * 32
    return fake


RUNS = [
    ("POST", "/v1.45/containers/trainer/start", b""),
    ("POST", "/v1.45/containers/trainer/restart?t=1", b""),
    ("POST", "/v1.45/containers/trainer/unpause", b""),
    ("POST", "/v1.45/containers/trainer/exec", b'{"Cmd":["ls","/dev"]}'),
    ("POST", "/v1.45/exec/e1/start", b'{"Detach":false,"Tty":false}'),
    ("POST", "/v1.45/containers/trainer/update", b'{"RestartPolicy":{"Name":"always"}}'),
    ("POST", "/containers/trainer/start", b""),  # no version prefix
]


def decide(gate: Gate, method: str, target: str, body: bytes) -> Any:
    return gate.decider.decide(method, target, "application/json" if body else None, body)


@pytest.mark.parametrize(("method", "target", "body"), RUNS, ids=[t for _, t, _ in RUNS])
class TestEveryRequestThatRunsAContainer:
    def test_refused_when_the_container_holds_a_name_no_longer_granted(
        self, gate: Gate, containers: FakeContainers, method: str, target: str, body: bytes
    ) -> None:
        decision = decide(gate, method, target, body)
        assert not decision.forward and decision.status == 403
        assert f"container trainer holds {GPU0}, which repo alpha has no grant for now" in decision.message
        assert f"rdc repo gpu grant {REF} --device {GPU0}" in decision.message
        assert "docker rm trainer" in decision.message
        assert decision.rules == ("grant",)

    def test_refused_while_setup_has_the_grant_suspended_naming_the_drift_and_the_confirm(
        self, gate: Gate, containers: FakeContainers, method: str, target: str, body: bytes
    ) -> None:
        drift = "it was granted on GPU-a at 0000:0a:00.0 and now reaches GPU-b at 0000:0a:00.0"
        held = Suspension(MOVED, drift, "2026-01-01T00:00:00Z")
        write_grants(gate.fm.machine, [Grant(gate.decider.repo.id, GPU0, False, "x", suspended=held)])
        decision = decide(gate, method, target, body)  # the gate's grants leave a suspended one out
        assert not decision.forward and decision.status == 403
        assert (
            f"container trainer holds {GPU0} and may not run: the grant of {GPU0} to repo {REF} is "
            f"suspended since 2026-01-01T00:00:00Z: {drift}"
        ) in decision.message
        assert f"`rdc repo gpu confirm {REF} --device {GPU0}`" in decision.message
        assert f"`rdc repo gpu revoke {REF} --device {GPU0}`" in decision.message

    def test_admitted_while_the_grant_is_in_force(
        self, gate: Gate, containers: FakeContainers, method: str, target: str, body: bytes
    ) -> None:
        gate.grant(GPU0)
        assert decide(gate, method, target, body).forward

    def test_a_container_without_devices_is_admitted(
        self, gate: Gate, containers: FakeContainers, method: str, target: str, body: bytes
    ) -> None:
        containers.execs["e1"] = "plain"
        assert decide(gate, method, target.replace("trainer", "plain"), body).forward

    def test_an_unreachable_daemon_fails_closed(
        self, gate: Gate, containers: FakeContainers, method: str, target: str, body: bytes
    ) -> None:
        containers.failing = True
        decision = decide(gate, method, target, body)
        assert not decision.forward and decision.status == 503
        assert "could not check which devices container" in decision.message


def test_every_missing_name_is_listed(gate: Gate, containers: FakeContainers) -> None:
    containers.add("c3" * 32, "both", GPU0, GPU1)
    gate.grant(GPU1)
    decision = decide(gate, "POST", "/v1.45/containers/both/start", b"")
    assert not decision.forward
    assert GPU0 in decision.message and f"holds {GPU1}" not in decision.message


def test_a_container_the_daemon_does_not_know_is_left_to_the_daemon(
    gate: Gate, containers: FakeContainers
) -> None:
    assert decide(gate, "POST", "/v1.45/containers/nosuch/start", b"").forward
    assert decide(gate, "POST", "/v1.45/exec/nosuch/start", b"{}").forward


def test_an_update_without_a_restart_policy_is_not_a_start(gate: Gate, containers: FakeContainers) -> None:
    for body in (b'{"Memory":1048576}', b'{"RestartPolicy":{"Name":"no"}}', b'{"RestartPolicy":{"Name":""}}'):
        assert decide(gate, "POST", "/v1.45/containers/trainer/update", body).forward
    assert containers.asked == []


def test_unreadable_grants_refuse_every_holder(gate: Gate, containers: FakeContainers) -> None:
    def broken(repo_id: str) -> frozenset[str]:
        raise OSError("grants.json: input/output error")

    gate.rebuild(containers=containers, grants=broken)
    decision = decide(gate, "POST", "/v1.45/containers/trainer/start", b"")
    assert not decision.forward and "its grants cannot be read" in decision.message


def test_the_lookup_waits_so_it_never_runs_on_the_event_loop(gate: Gate) -> None:
    """The daemon lookup calls may_block(): inline (on the loop) it raises, and the decision moves to
    a worker thread, as an image lookup does."""
    from rediacc_core.blocking import MustNotBlock, decisions_must_not_block
    from rediacc_core.gate.decide.containers import DaemonContainers

    lookup = DaemonContainers(gate.fm.root / "no-daemon.sock")
    with decisions_must_not_block(), pytest.raises(MustNotBlock):
        lookup.lookup("trainer")
    with pytest.raises(LookupFailed):
        lookup.lookup("trainer")


def test_a_decider_without_a_lookup_leaves_it_to_the_runtime_guard(gate: Gate) -> None:
    assert decide(gate, "POST", "/v1.45/containers/trainer/start", b"").forward


def test_a_copied_container_is_told_who_holds_its_device_exclusively(
    gate: Gate, containers: FakeContainers
) -> None:
    # A fork's copy of a GPU container: asking for the grant would be refused while another repo
    # holds the device exclusively, so the advice names that repo and the handover instead.
    blocked = (
        f"repo beta@m1 holds {GPU0} exclusively (to move it in one step: "
        f"`rdc repo gpu grant {REF} --device {GPU0} --exclusive --take-over`)"
    )
    gate.rebuild(containers=containers, in_the_way=lambda name: blocked if name == GPU0 else None)
    decision = decide(gate, "POST", "/v1.45/containers/trainer/start", b"")
    assert not decision.forward
    assert f"{GPU0} cannot be granted to repo alpha now: {blocked}" in decision.message
    assert "an operator's" not in decision.message
