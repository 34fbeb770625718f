"""Every render node is found with the device behind it, whatever the vendor."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rediacc_dri.discovery import discover, read_render_node, render_node_of_card, render_nodes
from rediacc_dri.testing import add_render_node, drm_capture_dir, install_drm_capture, intel_igpu

from rediacc_core.machine import Machine
from rediacc_core.testing import FakeMachine

MakeFake = Callable[[str], FakeMachine]


def test_intel_igpu_is_one_render_node_with_its_pci_device(fake_machine: FakeMachine) -> None:
    intel_igpu(fake_machine)

    [gpu] = discover(fake_machine.machine)

    assert gpu.vendor == "intel" and gpu.source == "dri"
    assert gpu.name == "Intel GPU 8086:5917"
    assert gpu.pci_bus_id == "0000:00:02.0"
    assert gpu.driver == "i915"
    assert gpu.index is None and gpu.memory_mib is None
    assert gpu.cdi_names == ("rediacc.io/dri=renderD128",)
    assert gpu.attributes == {"renderMinor": 128, "pciVendorId": "0x8086", "pciDeviceId": "0x5917"}


def test_a_machine_without_gpus_has_no_render_nodes(fake_machine: FakeMachine) -> None:
    assert discover(fake_machine.machine) == []
    fake_machine.mkdir("/sys/class/drm")  # the subsystem without any device
    assert discover(fake_machine.machine) == []


def test_cards_and_connectors_are_not_render_nodes(fake_machine: FakeMachine) -> None:
    intel_igpu(fake_machine)
    fake_machine.mkdir("/sys/class/drm/card0-eDP-1")
    fake_machine.write("/sys/class/drm/version", "drm 1.1.0 20060810\n")
    assert [g.attributes["renderMinor"] for g in discover(fake_machine.machine)] == [128]


def test_real_drm_capture_amd_and_intel_cards(fake_machine: FakeMachine) -> None:
    # prometheus/procfs fixture: an amdgpu Vega 10 (full device/ directory) and an i915 UHD 620
    # whose device/ holds only `uevent` (vendor and device ids come from PCI_ID there).
    given = install_drm_capture(fake_machine, drm_capture_dir())
    assert given == {"card0": 128, "card1": 129}

    amd, intel = discover(fake_machine.machine)

    assert (amd.vendor, amd.pci_bus_id, amd.driver) == ("amd", "0000:09:00.0", "amdgpu")
    assert amd.attributes == {"renderMinor": 128, "pciVendorId": "0x1002", "pciDeviceId": "0x687f"}
    assert amd.memory_mib == 8573157376 // 2**20 == 8176  # mem_info_vram_total
    assert amd.name == "AMD GPU 1002:687f"  # product_name is empty in the capture
    assert (intel.vendor, intel.pci_bus_id, intel.driver) == ("intel", "0000:00:02.0", "i915")
    assert intel.attributes == {"renderMinor": 129, "pciVendorId": "0x8086", "pciDeviceId": "0x5917"}
    assert intel.memory_mib is None


def test_real_drm_capture_cards_map_to_their_render_nodes(fake_machine: FakeMachine) -> None:
    install_drm_capture(fake_machine, drm_capture_dir())
    card0, card1 = render_node_of_card(fake_machine.machine, 0), render_node_of_card(fake_machine.machine, 1)
    assert card0 is not None and card0.name == "renderD128"
    assert card1 is not None and card1.name == "renderD129"
    assert render_node_of_card(fake_machine.machine, 7) is None


@pytest.mark.parametrize(
    ("vendor_id", "vendor", "driver"),
    [
        (0x10DE, "nvidia", "nvidia"),
        (0x1002, "amd", "amdgpu"),
        (0x8086, "intel", "xe"),
        (0x1234, "0x1234", "bochs"),
    ],
)
def test_vendor_comes_from_the_pci_vendor_id(
    fake_machine: FakeMachine, vendor_id: int, vendor: str, driver: str
) -> None:
    add_render_node(fake_machine, 128, "0000:41:00.0", vendor_id, 0x2330, driver)
    [gpu] = discover(fake_machine.machine)
    assert (gpu.vendor, gpu.driver, gpu.pci_bus_id) == (vendor, driver, "0000:41:00.0")


def test_virtio_gpu_sits_on_a_virtio_device_below_its_pci_function(fake_machine: FakeMachine) -> None:
    pci = fake_machine.pci_device("0000:00:02.0", 0x1AF4, 0x1050, driver="virtio-pci")
    add_render_node(fake_machine, 128, None, driver="virtio_gpu", device_path=f"{pci}/virtio0")

    [gpu] = discover(fake_machine.machine)

    assert gpu.vendor == "virtio" and gpu.name == "virtio GPU 1af4:1050"
    assert gpu.pci_bus_id == "0000:00:02.0"
    assert gpu.driver == "virtio_gpu"  # the driver of the DRM device, not of the PCI transport


def test_render_node_on_a_platform_device_has_no_pci_address(fake_machine: FakeMachine) -> None:
    add_render_node(
        fake_machine, 129, None, driver="amdgpu_xcp_drv", device_path="/sys/devices/platform/amdgpu_xcp.0"
    )
    [gpu] = discover(fake_machine.machine)
    assert gpu.vendor == "unknown" and gpu.pci_bus_id is None and gpu.driver == "amdgpu_xcp_drv"
    assert gpu.cdi_names == ("rediacc.io/dri=renderD129",)


def test_driver_falls_back_to_the_driver_link(fake_machine: FakeMachine) -> None:
    dev = add_render_node(fake_machine, 128, "0000:03:00.0", 0x1002, 0x740F, "amdgpu")
    uevent = fake_machine.path(f"{dev}/uevent")
    uevent.write_text(
        "".join(line + "\n" for line in uevent.read_text().splitlines() if not line.startswith("DRIVER="))
    )
    assert read_render_node(fake_machine.machine, 128).driver == "amdgpu"


def test_driver_version_of_an_out_of_tree_driver(fake_machine: FakeMachine) -> None:
    add_render_node(fake_machine, 128, "0000:03:00.0", 0x1002, 0x740F, "amdgpu")
    fake_machine.write("/sys/module/amdgpu/version", "6.8.5\n")
    assert discover(fake_machine.machine)[0].driver_version == "6.8.5"


def test_render_nodes_are_listed_by_minor(fake_machine: FakeMachine) -> None:
    add_render_node(fake_machine, 130, "0000:c1:00.0", 0x10DE, 0x2204, "nvidia")
    add_render_node(fake_machine, 128, "0000:00:02.0")
    add_render_node(fake_machine, 129, "0000:81:00.0", 0x10DE, 0x2204, "nvidia")
    assert [n.minor for n in render_nodes(fake_machine.machine)] == [128, 129, 130]


def test_a_device_link_leaving_the_machine_root_is_not_followed(fake_machine: FakeMachine) -> None:
    fake_machine.mkdir("/sys/class/drm/renderD128")
    fake_machine.path("/sys/class/drm/renderD128/device").symlink_to("/sys/devices")
    [gpu] = discover(fake_machine.machine)
    assert gpu.pci_bus_id is None and gpu.vendor == "unknown"


def test_discovery_reads_only_below_the_machine_root(make_fake_machine: MakeFake) -> None:
    one, other = make_fake_machine("one"), make_fake_machine("two")
    intel_igpu(one)
    assert discover(other.machine) == []
    assert len(discover(Machine("one-again", one.root))) == 1


def test_a_render_node_deeper_below_a_pci_function_is_not_that_function(fake_machine: FakeMachine) -> None:
    # e.g. a USB display adapter: the PCI function two levels up is the USB controller, not a GPU.
    usb = fake_machine.pci_device("0000:00:14.0", 0x8086, 0xA0ED, driver="xhci_hcd", pci_class=0x0C0330)
    add_render_node(fake_machine, 128, None, driver="udl", device_path=f"{usb}/usb1/1-1")
    [gpu] = discover(fake_machine.machine)
    assert gpu.pci_bus_id is None and gpu.name == "render node of udl"
