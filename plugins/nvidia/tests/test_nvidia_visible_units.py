"""NVIDIA_VISIBLE_DEVICES forms, and the hardware units of NVIDIA CDI names."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rediacc_nvidia.lookup import nvidia_gpus
from rediacc_nvidia.units import hardware_units
from rediacc_nvidia.visible import VisibleDevicesError, cdi_names, parse_visible, token_kind

from rediacc_core import Gpu, GpuPartition, Inventory

G0 = "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"
G1 = "GPU-12345678-aaaa-bbbb-cccc-0123456789cd"
M0 = "MIG-00000000-0000-0000-0000-000000000000"
M1 = "MIG-00000001-0000-0000-0000-000000000001"


def _gpus() -> list[Gpu]:
    return [
        Gpu(
            vendor="nvidia",
            source="nvidia",
            name="NVIDIA A100",
            index=0,
            pci_bus_id="0000:00:04.0",
            driver="nvidia",
            driver_version="535.54.03",
            memory_mib=40960,
            cdi_names=("nvidia.com/gpu=0", f"nvidia.com/gpu={G0}"),
            attributes={
                "uuid": G0,
                "cudaDriverVersion": "12.2",
                "computeCapability": "8.0",
                "brand": "NVIDIA",
            },
            partitions=(
                GpuPartition(
                    index=0,
                    uuid=M0,
                    profile="3g.20gb",
                    memory_mib=19968,
                    cdi_names=("nvidia.com/gpu=0:0", f"nvidia.com/gpu={M0}"),
                    attributes={"gpuInstanceId": 1, "computeInstanceId": 0},
                ),
                GpuPartition(
                    index=1,
                    uuid=M1,
                    profile="3g.20gb",
                    memory_mib=19968,
                    cdi_names=("nvidia.com/gpu=0:1", f"nvidia.com/gpu={M1}"),
                    attributes={"gpuInstanceId": 2, "computeInstanceId": 0},
                ),
            ),
        ),
        Gpu(
            vendor="nvidia",
            source="nvidia",
            name="NVIDIA RTX A5000",
            index=1,
            pci_bus_id="0000:c1:00.0",
            driver="nvidia",
            driver_version="535.54.03",
            memory_mib=24564,
            cdi_names=("nvidia.com/gpu=1", f"nvidia.com/gpu={G1}"),
            attributes={"uuid": G1},
        ),
        Gpu(
            vendor="amd",
            source="rediacc_amd",
            name="AMD Instinct MI210",
            index=None,
            pci_bus_id="0000:83:00.0",
        ),
    ]


@pytest.fixture
def inventory(inventory_of: Callable[..., Inventory]) -> Inventory:
    return inventory_of(_gpus())


@pytest.mark.parametrize(
    ("token", "kind"),
    [
        ("all", "all"),
        ("0", "index"),
        ("12", "index"),
        ("0:1", "mig-index"),
        (G0, "gpu-uuid"),
        (M0, "mig-uuid"),
        ("MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0", "mig-legacy"),
        ("0000:01:00.0", "pci"),
        ("00000000:C1:00.0", "pci"),
        ("c1:00.0", "pci"),
        ("gpu0", None),
        ("/dev/nvidia0", None),
    ],
)
def test_token_forms(token: str, kind: str | None) -> None:
    assert token_kind(token) == kind


@pytest.mark.parametrize(
    ("value", "state"), [("", "void"), ("void", "void"), ("  ", "void"), ("none", "none"), ("0,1", "devices")]
)
def test_void_empty_and_none_ask_for_no_gpu(value: str, state: str) -> None:
    assert parse_visible("NVIDIA_VISIBLE_DEVICES", value).state == state


@pytest.mark.parametrize(
    ("value", "names"),
    [
        ("all", ["nvidia.com/gpu=all"]),
        ("0", ["nvidia.com/gpu=0"]),
        ("0, 1", ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),
        ("1,all", ["nvidia.com/gpu=all"]),
        (G1, [f"nvidia.com/gpu={G1}"]),
        (M1, [f"nvidia.com/gpu={M1}"]),
        ("0:1", ["nvidia.com/gpu=0:1"]),
        ("MIG-GPU-27b94a00-ed54-5c24-b1fd-1054085de32a/2/0", ["nvidia.com/gpu=0:1"]),
        ("00000000:C1:00.0", ["nvidia.com/gpu=1"]),
        ("0000:00:04.0,0", ["nvidia.com/gpu=0"]),
    ],
)
def test_every_form_maps_to_the_exact_cdi_name(inventory: Inventory, value: str, names: list[str]) -> None:
    request = parse_visible("NVIDIA_VISIBLE_DEVICES", value)
    assert cdi_names(request, nvidia_gpus(inventory)) == names


def test_unknown_form_is_refused_naming_it() -> None:
    with pytest.raises(VisibleDevicesError, match="'gpu0' is not a GPU index"):
        parse_visible("NVIDIA_VISIBLE_DEVICES", "0,gpu0")


def test_device_the_machine_lacks_is_refused_listing_what_it_has(inventory: Inventory) -> None:
    with pytest.raises(VisibleDevicesError) as raised:
        cdi_names(parse_visible("NVIDIA_VISIBLE_DEVICES", "3"), nvidia_gpus(inventory))
    assert "'3', which is no GPU on this machine" in str(raised.value)
    assert "nvidia.com/gpu=0, " in str(raised.value)


def test_without_inventory_only_self_describing_forms_map() -> None:
    assert cdi_names(parse_visible("NVIDIA_VISIBLE_DEVICES", "0,0:1"), []) == [
        "nvidia.com/gpu=0",
        "nvidia.com/gpu=0:1",
    ]
    with pytest.raises(VisibleDevicesError, match="run `rdc machine setup`"):
        cdi_names(parse_visible("NVIDIA_VISIBLE_DEVICES", "0000:01:00.0"), [])


# --- hardware units --------------------------------------------------------------------------------


def test_gpu_names_are_their_pci_address(inventory: Inventory) -> None:
    assert hardware_units("nvidia.com/gpu=0", inventory) == ["pci:0000:00:04.0"]
    assert hardware_units(f"nvidia.com/gpu={G1}", inventory) == ["pci:0000:c1:00.0"]


def test_mig_devices_are_children_of_their_gpu(inventory: Inventory) -> None:
    assert hardware_units("nvidia.com/gpu=0:1", inventory) == ["pci:0000:00:04.0/mig:1"]
    assert hardware_units(f"nvidia.com/gpu={M0}", inventory) == ["pci:0000:00:04.0/mig:0"]


def test_all_is_every_nvidia_gpu_and_no_other_vendors(inventory: Inventory) -> None:
    assert hardware_units("nvidia.com/gpu=all", inventory) == ["pci:0000:00:04.0", "pci:0000:c1:00.0"]


def test_other_kinds_are_not_answered(inventory: Inventory) -> None:
    assert hardware_units("rediacc.io/amd=gpu0", inventory) is None
    assert hardware_units("nvidia.com/mig=0", inventory) is None


def test_unknown_nvidia_name_still_overlaps_itself(inventory: Inventory) -> None:
    assert hardware_units("nvidia.com/gpu=7", inventory) == ["cdi:nvidia.com/gpu=7"]
    assert hardware_units("nvidia.com/gpu=all", Inventory()) == ["cdi:nvidia.com/gpu=all"]
