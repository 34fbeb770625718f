"""The gate refuses a raw `/dev/nvidia*` device and names the exact `nvidia.com/gpu` device to use instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rediacc_nvidia.raw import request_rules

from rediacc_core import ApiRequest, GateContext, Gpu, Inventory, Refusal
from rediacc_core.gate.decide.decision import merge_refusals
from rediacc_core.gate.policy import mounts, rules
from rediacc_core.testing import FakeMachine

Ctx = Callable[..., GateContext]


def create(*paths: str) -> ApiRequest:
    """A container-create request with raw device entries, as `docker run --device PATH` sends."""
    devices = [{"PathOnHost": p, "PathInContainer": p, "CgroupPermissions": "rwm"} for p in paths]
    return ApiRequest(
        "POST", "/containers/create", {}, body={"Image": "cuda", "HostConfig": {"Devices": devices}}
    )


def gpu(index: int, **attributes: Any) -> Gpu:
    return Gpu(
        vendor="nvidia",
        source="nvidia",
        name="NVIDIA A100",
        index=index,
        pci_bus_id=f"0000:0{index}:00.0",
        driver="nvidia",
        driver_version="550.54.14",
        cdi_names=(f"nvidia.com/gpu={index}",),
        attributes=attributes,
    )


def only_refusal(verdicts: list[Any]) -> Refusal:
    [verdict] = verdicts
    assert isinstance(verdict, Refusal)
    assert verdict.rule == "raw-device" and verdict.status == 403
    return verdict


def test_raw_gpu_node_is_refused_with_its_exact_cdi_name(
    fake_machine: FakeMachine, gate_context: Ctx, inventory_of: Callable[..., Inventory]
) -> None:
    ctx = gate_context(fake_machine.machine, inventory=inventory_of([gpu(0, minor=0), gpu(1, minor=1)]))
    refusal = only_refusal(request_rules(create("/dev/nvidia0"), ctx))
    assert refusal.replacement == "--device nvidia.com/gpu=0"
    assert "raw device /dev/nvidia0 is refused" in refusal.message
    assert "rdc repo gpu grant alpha@fake --device nvidia.com/gpu=0" in refusal.message


def test_the_refusal_replaces_the_cores_about_the_same_device_only(
    fake_machine: FakeMachine, gate_context: Ctx
) -> None:
    request = create("/dev/nvidia0", "/dev/sda")
    binds = mounts.BindPolicy(files_dir="/files", roots=(), never=(), volume_drivers=frozenset(), pins=None)
    core = list(rules.container_create(request.body, rules.RuleContext("alpha@fake", binds)))
    ours = only_refusal(request_rules(request, gate_context(fake_machine.machine)))
    assert ours.subject == "/dev/nvidia0"
    merged = merge_refusals(core, [ours])
    assert [(r.rule, r.subject) for r in merged] == [
        ("raw-device", "/dev/sda"),
        ("raw-device", "/dev/nvidia0"),
    ]
    assert merged[1] is ours


def test_the_node_is_matched_by_device_minor_not_by_index(
    fake_machine: FakeMachine, gate_context: Ctx, inventory_of: Callable[..., Inventory]
) -> None:
    ctx = gate_context(fake_machine.machine, inventory=inventory_of([gpu(0, minor=3), gpu(1, minor=0)]))
    assert only_refusal(request_rules(create("/dev/nvidia0"), ctx)).replacement == "--device nvidia.com/gpu=1"


def test_a_granted_name_needs_no_grant_hint(
    fake_machine: FakeMachine, gate_context: Ctx, inventory_of: Callable[..., Inventory]
) -> None:
    ctx = gate_context(fake_machine.machine, grants={"nvidia.com/gpu=0"}, inventory=inventory_of([gpu(0)]))
    refusal = only_refusal(request_rules(create("/dev/nvidia0"), ctx))
    assert refusal.replacement == "--device nvidia.com/gpu=0"
    assert "rdc repo gpu grant" not in refusal.message


def test_without_an_inventory_the_minor_is_the_name(fake_machine: FakeMachine, gate_context: Ctx) -> None:
    refusal = only_refusal(request_rules(create("/dev/nvidia2"), gate_context(fake_machine.machine)))
    assert refusal.replacement == "--device nvidia.com/gpu=2"


@pytest.mark.parametrize("path", ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"])
def test_driver_nodes_point_at_the_gpu_devices_that_bring_them(
    fake_machine: FakeMachine, gate_context: Ctx, path: str
) -> None:
    refusal = only_refusal(request_rules(create(path), gate_context(fake_machine.machine)))
    assert refusal.replacement == "--device nvidia.com/gpu=<N>"
    assert "the driver's nodes come with every nvidia.com/gpu device" in refusal.message


def test_a_symlink_to_a_gpu_node_is_refused_naming_both(
    fake_machine: FakeMachine, gate_context: Ctx, inventory_of: Callable[..., Inventory]
) -> None:
    fake_machine.char_device("/dev/nvidia0", 195, 0)
    fake_machine.symlink("/dev/gpu-link", "/dev/nvidia0")
    ctx = gate_context(fake_machine.machine, inventory=inventory_of([gpu(0, minor=0)]))
    refusal = only_refusal(request_rules(create("/dev/gpu-link"), ctx))
    assert "raw device /dev/gpu-link (which is /dev/nvidia0) is refused" in refusal.message


def test_other_devices_are_not_ours(fake_machine: FakeMachine, gate_context: Ctx) -> None:
    assert request_rules(create("/dev/dri/renderD128", "/dev/null"), gate_context(fake_machine.machine)) == []
