"""The test kit third-party plugin authors use builds what the core builds."""

from __future__ import annotations

from collections.abc import Callable

from rediacc_core import GateContext, Gpu, GpuPartition, Inventory
from rediacc_core.files import schema_errors
from rediacc_core.testing import FakeMachine
from rediacc_core.testing.kit import inventory_document


def test_inventory_of_is_the_typed_inventory_of_a_valid_document(
    inventory_of: Callable[..., Inventory],
) -> None:
    gpu = Gpu(
        vendor="example",
        source="example",
        name="Example",
        index=0,
        pci_bus_id="0000:01:00.0",
        cdi_names=("vendor.example/gpu=0",),
        partitions=(GpuPartition(index=1, cdi_names=("vendor.example/gpu=0:1",)),),
    )
    assert schema_errors(inventory_document([gpu], platform="wsl"), "inventory.schema.json") == []
    inventory = inventory_of([gpu], platform="wsl")
    assert inventory.platform == "wsl" and inventory.gpus == (gpu,)
    assert inventory.holder("vendor.example/gpu=0:1") == (gpu, gpu.partitions[0])


def test_gate_context_answers_images_and_collects_log_lines(
    gate_context: Callable[..., GateContext], fake_machine: FakeMachine
) -> None:
    lines: list[str] = []
    ctx = gate_context(fake_machine.machine, ["vendor.example/gpu=0"], images={"img": {"Env": []}}, log=lines)
    ctx.log("noted")
    assert ctx.repo_ref == "alpha@fake" and ctx.grants == frozenset({"vendor.example/gpu=0"})
    assert ctx.image_config("img") == {"Env": []} and ctx.image_config("other") is None
    assert lines == ["noted"]
