"""A start the gate will refuse leaves nothing to wait for: a create naming a GPU held back for its
health is refused at create, and a refused start of a `--rm` container removes it, as the daemon
does when its own start fails, so `docker run --rm` prints the reason instead of waiting forever."""

from __future__ import annotations

import json
from typing import Any

from rediacc_core.gate.decide.containers import Container
from rediacc_core.gate.decide.decider import Decider
from rediacc_core.gate.decide.health_check import HealthReader
from rediacc_core.health import record_events, unhealthy_cards
from rediacc_core.model import Gpu, HealthEvent, Inventory

Gate = Any  # tests/gate/conftest.py's Gate
CARD0, CARD1 = "0000:01:00.0", "0000:02:00.0"
GPU0, GPU1 = "vendor.example/gpu=0", "vendor.example/gpu=1"
INVENTORY = Inventory(
    gpus=(
        Gpu(vendor="vendor", source="programmable", name="V", index=0, pci_bus_id=CARD0, cdi_names=(GPU0,)),
        Gpu(vendor="vendor", source="programmable", name="V", index=1, pci_bus_id=CARD1, cdi_names=(GPU1,)),
    )
)
FAULT = HealthEvent(pci_bus_id=CARD0, reason="xid-79", message="NVRM: Xid (PCI:0000:01:00): 79", key="k")


class Containers:
    """The daemon's containers, by name: what each holds, whether it was made with --rm and runs."""

    def __init__(self, *known: Container) -> None:
        self.known = {c.name: c for c in known}
        self.removed: list[str] = []

    def lookup(self, ref: str) -> Container | None:
        return self.known.get(ref)

    def exec_container(self, exec_id: str) -> str | None:
        return None

    def remove(self, container_id: str) -> str | None:
        self.removed.append(container_id)
        return None


def decider(gate: Gate, containers: Containers, health: HealthReader, grants: frozenset[str]) -> Decider:
    return Decider(
        gate.fm.machine,
        gate.decider.repo,
        gate.decider.plugins,
        lambda image: None,
        gate.logs.append,
        grants=lambda repo_id: grants,
        inventory=lambda: INVENTORY,
        containers=containers,
        health=health,
    )


def create_body(*names: str) -> bytes:
    host = {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": list(names)}], "AutoRemove": True}
    return json.dumps({"Image": "busybox", "HostConfig": host}).encode()


def test_a_create_naming_an_unhealthy_gpu_is_refused_at_create(gate: Gate) -> None:
    machine = gate.fm.machine
    held_back = decider(
        gate, Containers(), lambda: unhealthy_cards(record_events(machine, [FAULT])), frozenset({GPU0, GPU1})
    )
    refused = held_back.decide("POST", "/v1.45/containers/create", "application/json", create_body(GPU0))
    assert not refused.forward and refused.status == 403 and refused.rules == ("gpu-health",)
    assert f"{GPU0} reaches the GPU at {CARD0}: its driver reported xid-79" in refused.message
    assert f"rdc machine gpu clear m1 --device {GPU0}" in refused.message
    admitted = held_back.decide("POST", "/v1.45/containers/create", "application/json", create_body(GPU1))
    assert admitted.forward, admitted.message


def test_a_refused_start_of_a_rm_container_removes_it(gate: Gate) -> None:
    made_with_rm = Container("a" * 64, "job", (GPU0,), auto_remove=True, state="created")
    kept = Container("b" * 64, "kept", (GPU0,), state="created")
    containers = Containers(made_with_rm, kept)
    lease_ended = decider(gate, containers, dict, frozenset())  # the grant is gone since the create
    refused = lease_ended.decide("POST", "/v1.45/containers/job/start", None, b"")
    assert not refused.forward and refused.rules == ("grant",)
    assert "container job was made with --rm, so the gate removed it" in refused.message
    assert containers.removed == ["a" * 64]
    # Without --rm the container is the user's to keep: only the refusal.
    again = lease_ended.decide("POST", "/v1.45/containers/kept/start", None, b"")
    assert not again.forward and "removed" not in again.message and containers.removed == ["a" * 64]


def test_an_admitted_start_removes_nothing(gate: Gate) -> None:
    containers = Containers(Container("a" * 64, "job", (GPU0,), auto_remove=True, state="created"))
    granted = decider(gate, containers, dict, frozenset({GPU0}))
    assert granted.decide("POST", "/v1.45/containers/job/start", None, b"").forward
    assert containers.removed == []


def test_a_create_reads_the_health_records_inline_and_no_kernel_log(gate: Gate) -> None:
    """At create the records as they are decide (re-read when the file changed): no plugin is asked
    for events, so the decision stays on the gate's event loop, as a create without devices does."""
    from rediacc_core.blocking import decisions_must_not_block

    record_events(gate.fm.machine, [FAULT])
    default = Decider(
        gate.fm.machine,
        gate.decider.repo,
        gate.decider.plugins,
        lambda image: None,
        gate.logs.append,
        grants=lambda repo_id: frozenset({GPU0}),
        inventory=lambda: INVENTORY,
        containers=Containers(),
    )
    with decisions_must_not_block():
        refused = default.decide("POST", "/v1.45/containers/create", "application/json", create_body(GPU0))
    assert not refused.forward and refused.rules == ("gpu-health",)
