"""The test kit third-party plugin authors use builds what the core builds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rediacc_core import GateContext, Gpu, GpuPartition
from rediacc_core.files import schema_errors
from rediacc_core.testing import FakeMachine


def test_inventory_of_is_a_valid_inventory(inventory_of: Callable[..., dict[str, Any]]) -> None:
    gpu = Gpu(
        vendor="example",
        source="example",
        name="Example",
        index=0,
        pci_bus_id="0000:01:00.0",
        cdi_names=("vendor.example/gpu=0",),
        partitions=(GpuPartition(index=1, cdi_names=("vendor.example/gpu=0:1",)),),
    )
    document = inventory_of([gpu], platform="wsl")
    assert schema_errors(document, "inventory.schema.json") == []
    assert document["gpus"][0]["partitions"][0]["cdiNames"] == ["vendor.example/gpu=0:1"]


def test_gate_context_answers_images_and_collects_log_lines(
    gate_context: Callable[..., GateContext], fake_machine: FakeMachine
) -> None:
    lines: list[str] = []
    ctx = gate_context(fake_machine.machine, ["vendor.example/gpu=0"], images={"img": {"Env": []}}, log=lines)
    ctx.log("noted")
    assert ctx.repo_ref == "alpha@fake" and ctx.grants == frozenset({"vendor.example/gpu=0"})
    assert ctx.image_config("img") == {"Env": []} and ctx.image_config("other") is None
    assert lines == ["noted"]
