"""The gate refuses raw `/dev/dri` devices and names the `rediacc.io/dri` device to use instead."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rediacc_dri.rules import request_rules
from rediacc_dri.testing import add_by_path_links, add_render_node, intel_igpu

from rediacc_core import ApiRequest, GateContext, Gpu, Inventory, Refusal
from rediacc_core.plugins import load_plugins
from rediacc_core.testing import FakeMachine

Ctx = Callable[..., GateContext]


def create(*paths: str, **host_config: Any) -> ApiRequest:
    """A canonical container-create request with raw device entries, as the CLI's `--device` sends."""
    devices = [{"PathOnHost": p, "PathInContainer": p, "CgroupPermissions": "rwm"} for p in paths]
    body = {"Image": "bb:latest", "HostConfig": {"Devices": devices, **host_config}}
    return ApiRequest("POST", "/containers/create", {}, body=body)


@pytest.fixture
def two_gpu_machine(fake_machine: FakeMachine) -> FakeMachine:
    intel_igpu(fake_machine)  # card0, renderD128
    add_render_node(fake_machine, 129, "0000:03:00.0", 0x1002, 0x740F, "amdgpu", card=1)
    return fake_machine


def only_refusal(verdicts: list[Any]) -> Refusal:
    [verdict] = verdicts
    assert isinstance(verdict, Refusal)
    assert verdict.rule == "raw-device" and verdict.status == 403
    return verdict


def test_raw_render_node_is_refused_with_its_cdi_name(
    two_gpu_machine: FakeMachine, gate_context: Ctx
) -> None:
    refusal = only_refusal(
        request_rules(create("/dev/dri/renderD129"), gate_context(two_gpu_machine.machine))
    )
    assert refusal.replacement == "--device rediacc.io/dri=renderD129"
    assert "raw device /dev/dri/renderD129 is refused" in refusal.message
    assert "rdc repo gpu grant alpha@fake --device rediacc.io/dri=renderD129" in refusal.message


def test_a_granted_name_needs_no_grant_hint(two_gpu_machine: FakeMachine, gate_context: Ctx) -> None:
    ctx = gate_context(two_gpu_machine.machine, grants={"rediacc.io/dri=renderD128"})
    refusal = only_refusal(request_rules(create("/dev/dri/renderD128"), ctx))
    assert refusal.replacement == "--device rediacc.io/dri=renderD128"
    assert "rdc repo gpu grant" not in refusal.message


@pytest.mark.parametrize(("card", "render"), [("card0", "renderD128"), ("card1", "renderD129")])
def test_primary_node_maps_to_the_render_node_of_the_same_card(
    two_gpu_machine: FakeMachine, gate_context: Ctx, card: str, render: str
) -> None:
    refusal = only_refusal(request_rules(create(f"/dev/dri/{card}"), gate_context(two_gpu_machine.machine)))
    assert refusal.replacement == f"--device rediacc.io/dri={render}"


def test_the_whole_directory_names_every_render_node(two_gpu_machine: FakeMachine, gate_context: Ctx) -> None:
    refusal = only_refusal(request_rules(create("/dev/dri"), gate_context(two_gpu_machine.machine)))
    assert refusal.replacement == "--device rediacc.io/dri=renderD128 --device rediacc.io/dri=renderD129"


@pytest.mark.parametrize(
    "spelling",
    ["/dev/dri/renderD128/", "//dev/dri/renderD128", "/dev/../dev/./dri/renderD128", "dev/dri/renderD128"],
)
def test_paths_are_judged_as_the_daemon_cleans_them(
    two_gpu_machine: FakeMachine, gate_context: Ctx, spelling: str
) -> None:
    refusal = only_refusal(request_rules(create(spelling), gate_context(two_gpu_machine.machine)))
    assert refusal.replacement == "--device rediacc.io/dri=renderD128"


def test_a_symlink_into_dev_dri_is_followed(two_gpu_machine: FakeMachine, gate_context: Ctx) -> None:
    two_gpu_machine.symlink("/dev/my-gpu", "/dev/dri/renderD129")
    refusal = only_refusal(request_rules(create("/dev/my-gpu"), gate_context(two_gpu_machine.machine)))
    assert refusal.replacement == "--device rediacc.io/dri=renderD129"
    assert "/dev/my-gpu (which is /dev/dri/renderD129)" in refusal.message


def test_udev_by_path_links_name_the_card_render_node(
    two_gpu_machine: FakeMachine, gate_context: Ctx
) -> None:
    add_by_path_links(two_gpu_machine, "0000:03:00.0", 129, card=1)
    ctx = gate_context(two_gpu_machine.machine)
    for link in ("/dev/dri/by-path/pci-0000:03:00.0-render", "/dev/dri/by-path/pci-0000:03:00.0-card"):
        assert (
            only_refusal(request_rules(create(link), ctx)).replacement == "--device rediacc.io/dri=renderD129"
        )
    # Without the links (e.g. no udev), the name alone still tells which card was meant.
    two_gpu_machine.path("/dev/dri/by-path/pci-0000:03:00.0-render").unlink()
    verdict = only_refusal(request_rules(create("/dev/dri/by-path/pci-0000:03:00.0-render"), ctx))
    assert verdict.replacement == "--device rediacc.io/dri=renderD129"


def test_an_unknown_node_under_dev_dri_is_still_refused(fake_machine: FakeMachine, gate_context: Ctx) -> None:
    refusal = only_refusal(request_rules(create("/dev/dri/card5"), gate_context(fake_machine.machine)))
    assert refusal.replacement == "--device rediacc.io/dri=renderD<N>"
    assert "rdc machine gpu list fake" in refusal.message


def test_other_names_for_the_same_render_node_are_mentioned(
    two_gpu_machine: FakeMachine, gate_context: Ctx
) -> None:
    render = {"renderMinor": 129}
    inventory = Inventory(
        gpus=(
            Gpu(
                vendor="x", source="dri", name="", cdi_names=("rediacc.io/dri=renderD129",), attributes=render
            ),
            Gpu(
                vendor="x", source="example", name="", cdi_names=("vendor.example/gpu=0",), attributes=render
            ),
        )
    )
    refusal = only_refusal(
        request_rules(
            create("/dev/dri/renderD129"), gate_context(two_gpu_machine.machine, inventory=inventory)
        )
    )
    assert "vendor.example/gpu=0" in refusal.message


@pytest.mark.parametrize(
    "path", ["/dev/null", "/dev/kfd", "/dev/drix", "/dev/dri2/renderD128", "/tmp/dev/dri"]
)
def test_paths_outside_dev_dri_are_not_this_rule(
    two_gpu_machine: FakeMachine, gate_context: Ctx, path: str
) -> None:
    assert request_rules(create(path), gate_context(two_gpu_machine.machine)) == []


def test_cdi_names_in_devices_are_compose_legacy_not_raw(
    two_gpu_machine: FakeMachine, gate_context: Ctx
) -> None:
    assert request_rules(create("rediacc.io/dri=renderD128"), gate_context(two_gpu_machine.machine)) == []


def test_each_raw_entry_gets_its_own_refusal(two_gpu_machine: FakeMachine, gate_context: Ctx) -> None:
    verdicts = request_rules(
        create("/dev/dri/renderD128", "/dev/null", "/dev/dri/card1"), gate_context(two_gpu_machine.machine)
    )
    assert [v.replacement for v in verdicts if isinstance(v, Refusal)] == [
        "--device rediacc.io/dri=renderD128",
        "--device rediacc.io/dri=renderD129",
    ]


def test_container_update_devices_are_judged_too(two_gpu_machine: FakeMachine, gate_context: Ctx) -> None:
    body = {
        "Devices": [
            {"PathOnHost": "/dev/dri/renderD128", "PathInContainer": "/dev/x", "CgroupPermissions": "rw"}
        ]
    }
    request = ApiRequest("POST", "/containers/abc/update", {}, body=body)
    assert only_refusal(request_rules(request, gate_context(two_gpu_machine.machine))).replacement == (
        "--device rediacc.io/dri=renderD128"
    )


@pytest.mark.parametrize(
    "request_",
    [
        ApiRequest("GET", "/containers/json", {}),
        ApiRequest("POST", "/containers/create", {}, body={"Image": "bb"}),
        ApiRequest("POST", "/containers/create", {}, body={"HostConfig": {"Devices": None}}),
        ApiRequest(
            "POST", "/volumes/create", {}, body={"Name": "v", "Devices": [{"PathOnHost": "/dev/dri"}]}
        ),
    ],
)
def test_requests_without_raw_devices_pass(
    two_gpu_machine: FakeMachine, gate_context: Ctx, request_: ApiRequest
) -> None:
    assert request_rules(request_, gate_context(two_gpu_machine.machine)) == []


def test_rule_through_the_plugin_manager(
    two_gpu_machine: FakeMachine, gate_context: Ctx, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "dri")
    verdicts = load_plugins().request_rules(
        create("/dev/dri/card0"), gate_context(two_gpu_machine.machine)
    )  # rdc_request_rules
    assert only_refusal(verdicts).replacement == "--device rediacc.io/dri=renderD128"
