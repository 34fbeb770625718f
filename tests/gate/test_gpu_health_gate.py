"""The gate and GPU health: a start holding a name that reaches a card held back is refused, names
on healthy cards pass, and records that cannot be read refuse rather than let a faulty card through."""

from __future__ import annotations

from typing import Any

from rediacc_core.gate.decide.containers import Container
from rediacc_core.gate.decide.decider import Decider, Decision
from rediacc_core.gate.decide.health_check import HealthReader
from rediacc_core.health import LiveHealth, health_path, record_events, unhealthy_cards
from rediacc_core.model import Gpu, HealthEvent, Inventory

Gate = Any  # tests/gate/conftest.py's Gate: the decider on a simulated machine
CARD0, CARD1 = "0000:01:00.0", "0000:02:00.0"
INVENTORY = Inventory(
    gpus=(
        Gpu(vendor="vendor", source="programmable", name="V", index=0, pci_bus_id=CARD0,
            cdi_names=("vendor.example/gpu=0",)),
        Gpu(vendor="vendor", source="programmable", name="V", index=1, pci_bus_id=CARD1,
            cdi_names=("vendor.example/gpu=1",)),
    )
)  # fmt: skip


class Containers:
    def lookup(self, ref: str) -> Container | None:
        names = {"on0": ("vendor.example/gpu=0",), "on1": ("vendor.example/gpu=1",)}.get(ref)
        return None if names is None else Container(ref * 16, ref, names)

    def exec_container(self, exec_id: str) -> str | None:
        return None


def decider(gate: Gate, health: HealthReader) -> Decider:
    """The gate's decider with every seam in hand: the cards held back come from `health`."""
    return Decider(
        gate.fm.machine,
        gate.decider.repo,
        gate.decider.plugins,
        lambda image: None,
        gate.logs.append,
        grants=lambda repo_id: frozenset({"vendor.example/gpu=0", "vendor.example/gpu=1"}),
        inventory=lambda: INVENTORY,
        containers=Containers(),
        health=health,
    )


def start(decider: Decider, name: str) -> Decision:
    return decider.decide("POST", f"/v1.45/containers/{name}/start", None, b"")


def test_only_the_start_reaching_the_faulty_card_is_refused(gate: Gate) -> None:
    fault = HealthEvent(pci_bus_id=CARD0, reason="xid-79", message="NVRM: Xid (PCI:0000:01:00): 79", key="k")
    machine = gate.fm.machine
    gpu_gate = decider(gate, lambda: unhealthy_cards(record_events(machine, [fault])))
    refused = start(gpu_gate, "on0")
    assert not refused.forward and refused.rules == ("gpu-health",)
    assert (
        "container on0 holds vendor.example/gpu=0, which reaches the GPU at 0000:01:00.0" in refused.message
    )
    assert "rdc machine gpu clear m1 --device vendor.example/gpu=0" in refused.message
    assert start(gpu_gate, "on1").forward


def test_unreadable_records_refuse_the_start(gate: Gate) -> None:
    path = health_path(gate.fm.machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    refused = start(decider(gate, LiveHealth(gate.fm.machine).unhealthy), "on1")
    assert not refused.forward and refused.rules == ("gpu-health",)
    assert "the GPU health records cannot be read" in refused.message
