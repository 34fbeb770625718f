"""AMD GPUs are found through the KFD topology, only where `/dev/kfd` exists."""

from __future__ import annotations

import pytest
from rediacc_amd.discovery import discover
from rediacc_amd.testing import add_cpu_node, add_kfd_node, install_kfd_capture, two_amd_gpus

from rediacc_core.plugins import load_plugins
from rediacc_core.testing import FakeMachine


def test_two_amd_gpus(fake_machine: FakeMachine) -> None:
    two_amd_gpus(fake_machine)

    first, second = discover(fake_machine.machine)

    assert (first.vendor, first.source, first.driver) == ("amd", "amd", "amdgpu")
    assert (first.index, first.pci_bus_id, first.name) == (0, "0000:03:00.0", "AMD Instinct MI210")
    assert first.memory_mib == 65536
    assert first.cdi_names == ("rediacc.io/amd=gpu0",)
    assert first.attributes == {
        "renderMinor": 128,
        "gpuId": 1003,
        "gfxTarget": "gfx90a",
        "partition": None,
        "kfdNode": 3,
        "pciDeviceId": "0x740f",
        "uniqueId": "1801979520617338022",
    }
    assert (second.index, second.pci_bus_id, second.attributes["renderMinor"]) == (1, "0000:83:00.0", 129)
    assert second.cdi_names == ("rediacc.io/amd=gpu1",)


def test_no_kfd_node_means_no_amd_gpus(fake_machine: FakeMachine) -> None:
    install_kfd_capture(fake_machine, "mi210-x8-xgmi", kfd=False)
    assert discover(fake_machine.machine) == []


def test_a_machine_without_gpus(fake_machine: FakeMachine) -> None:
    assert discover(fake_machine.machine) == []
    fake_machine.char_device("/dev/kfd", 238, 0)  # the module loaded, no topology
    assert discover(fake_machine.machine) == []


def test_cpu_only_topology_has_no_gpus(fake_machine: FakeMachine) -> None:
    add_cpu_node(fake_machine, 0)
    add_kfd_node(fake_machine)
    assert discover(fake_machine.machine) == []


def test_partitions_are_gpus_of_their_own(fake_machine: FakeMachine) -> None:
    install_kfd_capture(fake_machine, "mi308x-cpx")
    gpus = discover(fake_machine.machine)
    assert len(gpus) == 32
    assert [g.cdi_names[0] for g in gpus[:3]] == [
        "rediacc.io/amd=gpu0",
        "rediacc.io/amd=gpu1",
        "rediacc.io/amd=gpu2",
    ]
    g5 = gpus[5]
    assert (g5.pci_bus_id, g5.attributes["partition"], g5.attributes["renderMinor"]) == (
        "0000:80:00.0",
        1,
        137,
    )
    assert g5.name == "AMD Instinct MI308X (partition 1)" and g5.memory_mib == 49152
    assert g5.attributes["kfdNode"] == 7 and g5.attributes["gpuId"] == 42334


def test_driver_version_when_the_module_publishes_one(fake_machine: FakeMachine) -> None:
    two_amd_gpus(fake_machine)
    fake_machine.write("/sys/module/amdgpu/version", "6.10.5\n")
    assert {g.driver_version for g in discover(fake_machine.machine)} == {"6.10.5"}


def test_discover_through_the_plugin_manager(
    fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "amd")
    two_amd_gpus(fake_machine)
    plugins = load_plugins()
    assert plugins.names() == ["amd"]
    assert set(plugins.infos[0].hooks) == {
        "rdc_discover",
        "rdc_cdi_specs",
        "rdc_hardware_units",
        "rdc_request_rules",
        "rdc_health",
    }
    assert [g.cdi_names for g in plugins.discover(fake_machine.machine)] == [  # rdc_discover
        ("rediacc.io/amd=gpu0",),
        ("rediacc.io/amd=gpu1",),
    ]
