"""The gate refuses a raw `/dev/kfd` and names the `rediacc.io/amd` device to use instead."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
from rediacc_amd.discovery import discover
from rediacc_amd.rules import request_rules
from rediacc_amd.testing import install_kfd_capture, two_amd_gpus

from rediacc_core import ApiRequest, GateContext, Gpu, Inventory, Refusal
from rediacc_core.plugins import load_plugins
from rediacc_core.testing import FakeMachine

Ctx = Callable[..., GateContext]
InventoryOf = Callable[[Iterable[Gpu]], Inventory]


def create(*paths: str) -> ApiRequest:
    devices = [{"PathOnHost": p, "PathInContainer": p, "CgroupPermissions": "rwm"} for p in paths]
    return ApiRequest(
        "POST", "/containers/create", {}, body={"Image": "bb", "HostConfig": {"Devices": devices}}
    )


def only_refusal(verdicts: list[Any]) -> Refusal:
    [verdict] = verdicts
    assert isinstance(verdict, Refusal)
    assert verdict.rule == "raw-device" and verdict.status == 403
    return verdict


@pytest.fixture
def two_gpus(fake_machine: FakeMachine) -> FakeMachine:
    two_amd_gpus(fake_machine)  # gpu0 = renderD128, gpu1 = renderD129
    return fake_machine


def test_kfd_with_a_render_node_names_that_gpu(
    two_gpus: FakeMachine, gate_context: Ctx, inventory_of: InventoryOf
) -> None:
    ctx = gate_context(two_gpus.machine, inventory=inventory_of(discover(two_gpus.machine)))
    refusal = only_refusal(request_rules(create("/dev/kfd", "/dev/dri/renderD129"), ctx))
    assert refusal.replacement == "--device rediacc.io/amd=gpu1"
    assert "raw device /dev/kfd is refused" in refusal.message
    assert "rdc repo gpu grant alpha@fake --device rediacc.io/amd=gpu1" in refusal.message


def test_kfd_alone_on_several_gpus_names_all(
    two_gpus: FakeMachine, gate_context: Ctx, inventory_of: InventoryOf
) -> None:
    ctx = gate_context(two_gpus.machine, inventory=inventory_of(discover(two_gpus.machine)))
    refusal = only_refusal(request_rules(create("/dev/kfd"), ctx))
    assert refusal.replacement == "--device rediacc.io/amd=all"
    assert "rediacc.io/amd=gpu0 … rediacc.io/amd=gpu1" in refusal.message


def test_kfd_on_a_one_gpu_machine_names_gpu0(fake_machine: FakeMachine, gate_context: Ctx) -> None:
    install_kfd_capture(fake_machine, "mi25-vega10-1gpu")
    # No inventory yet: the rule reads the machine's topology itself.
    refusal = only_refusal(
        request_rules(create("/dev/kfd"), gate_context(fake_machine.machine, grants={"rediacc.io/amd=gpu0"}))
    )
    assert refusal.replacement == "--device rediacc.io/amd=gpu0"
    assert "rdc repo gpu grant" not in refusal.message


def test_partition_render_nodes_name_their_partitions(fake_machine: FakeMachine, gate_context: Ctx) -> None:
    install_kfd_capture(fake_machine, "mi308x-cpx")
    refusal = only_refusal(
        request_rules(
            create("/dev/kfd", "/dev/dri/renderD137", "/dev/dri/renderD129"),
            gate_context(fake_machine.machine),
        )
    )
    assert refusal.replacement == "--device rediacc.io/amd=gpu1 --device rediacc.io/amd=gpu5"


@pytest.mark.parametrize("spelling", ["/dev/kfd", "//dev/kfd", "/dev/./kfd/", "dev/kfd", "/dev/../dev/kfd"])
def test_spellings_of_kfd(two_gpus: FakeMachine, gate_context: Ctx, spelling: str) -> None:
    assert only_refusal(request_rules(create(spelling), gate_context(two_gpus.machine))).rule == "raw-device"


def test_a_symlink_to_kfd_is_followed(two_gpus: FakeMachine, gate_context: Ctx) -> None:
    two_gpus.symlink("/dev/compute", "/dev/kfd")
    refusal = only_refusal(request_rules(create("/dev/compute"), gate_context(two_gpus.machine)))
    assert "/dev/compute (which is /dev/kfd)" in refusal.message


def test_kfd_on_a_machine_without_amd_gpus(fake_machine: FakeMachine, gate_context: Ctx) -> None:
    refusal = only_refusal(
        request_rules(create("/dev/kfd"), gate_context(fake_machine.machine, inventory=Inventory()))
    )
    assert refusal.replacement == "--device rediacc.io/amd=gpu<N>"
    assert "rdc machine gpu list fake" in refusal.message


@pytest.mark.parametrize("path", ["/dev/dri/renderD128", "/dev/null", "/dev/kfd2", "rediacc.io/amd=gpu0"])
def test_other_devices_are_not_this_rule(two_gpus: FakeMachine, gate_context: Ctx, path: str) -> None:
    assert request_rules(create(path), gate_context(two_gpus.machine)) == []


def test_rule_through_the_plugin_manager(
    two_gpus: FakeMachine, gate_context: Ctx, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "amd")
    verdicts = load_plugins().request_rules(
        create("/dev/kfd", "/dev/dri/renderD128"), gate_context(two_gpus.machine)
    )  # rdc_request_rules
    assert only_refusal(verdicts).replacement == "--device rediacc.io/amd=gpu0"


def test_container_update_devices_are_judged_too(two_gpus: FakeMachine, gate_context: Ctx) -> None:
    body = {"Devices": [{"PathOnHost": "/dev/kfd", "PathInContainer": "/dev/kfd", "CgroupPermissions": "rw"}]}
    request = ApiRequest("POST", "/containers/abc/update", {}, body=body)
    assert only_refusal(request_rules(request, gate_context(two_gpus.machine))).rule == "raw-device"
