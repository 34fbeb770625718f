"""A `rediacc.io/dri` name reaches its card, or its card's partition, for exclusive grants."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from rediacc_dri.discovery import discover
from rediacc_dri.testing import add_render_node, intel_igpu
from rediacc_dri.units import hardware_units

from rediacc_core import Gpu, Inventory
from rediacc_core.plugins import load_plugins
from rediacc_core.testing import FakeMachine

InventoryOf = Callable[[Iterable[Gpu]], Inventory]


def test_a_render_node_reaches_its_pci_card(fake_machine: FakeMachine, inventory_of: InventoryOf) -> None:
    intel_igpu(fake_machine)
    inventory = inventory_of(discover(fake_machine.machine))
    assert hardware_units("rediacc.io/dri=renderD128", inventory) == ["pci:0000:00:02.0"]


def test_names_of_other_kinds_are_not_ours() -> None:
    assert hardware_units("vendor.example/gpu=0", Inventory()) is None
    assert hardware_units("rediacc.io/drix=renderD128", Inventory()) is None


def test_a_partition_recorded_by_another_plugin_wins() -> None:
    card = "0000:05:00.0"
    inventory = Inventory(
        gpus=(
            Gpu(vendor="x", source="dri", name="", pci_bus_id=card, attributes={"renderMinor": 128}),
            Gpu(vendor="x", source="dri", name="", attributes={"renderMinor": 129}),
            Gpu(
                vendor="x",
                source="x",
                name="",
                pci_bus_id=card,
                attributes={"renderMinor": 128, "partition": 0},
            ),
            Gpu(
                vendor="x",
                source="x",
                name="",
                pci_bus_id=card,
                attributes={"renderMinor": 129, "partition": 1},
            ),
        )
    )
    assert hardware_units("rediacc.io/dri=renderD128", inventory) == ["pci:0000:05:00.0/partition:0"]
    assert hardware_units("rediacc.io/dri=renderD129", inventory) == ["pci:0000:05:00.0/partition:1"]


def test_several_render_nodes_on_one_card_are_numbered_in_order(
    fake_machine: FakeMachine, inventory_of: InventoryOf
) -> None:
    add_render_node(fake_machine, 131, "0000:41:00.0", 0x1002, 0x74A1, "amdgpu")
    add_render_node(fake_machine, 130, "0000:41:00.0", 0x1002, 0x74A1, "amdgpu")
    inventory = inventory_of(discover(fake_machine.machine))
    assert hardware_units("rediacc.io/dri=renderD130", inventory) == ["pci:0000:41:00.0/partition:0"]
    assert hardware_units("rediacc.io/dri=renderD131", inventory) == ["pci:0000:41:00.0/partition:1"]


def test_a_node_without_a_card_is_its_own_unit(fake_machine: FakeMachine, inventory_of: InventoryOf) -> None:
    add_render_node(fake_machine, 128, None, driver="vgem", device_path="/sys/devices/platform/vgem")
    inventory = inventory_of(discover(fake_machine.machine))
    assert hardware_units("rediacc.io/dri=renderD128", inventory) == ["drm:renderD128"]
    assert hardware_units("rediacc.io/dri=renderD140", Inventory()) == ["drm:renderD140"]


def test_a_malformed_name_of_our_kind_reserves_itself() -> None:
    assert hardware_units("rediacc.io/dri=card0", Inventory()) == ["cdi:rediacc.io/dri=card0"]


def test_units_through_the_plugin_manager(
    fake_machine: FakeMachine, inventory_of: InventoryOf, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "dri")
    intel_igpu(fake_machine)
    plugins = load_plugins()
    inventory = inventory_of(plugins.discover(fake_machine.machine))
    assert plugins.hardware_units("rediacc.io/dri=renderD128", inventory) == [
        "pci:0000:00:02.0"
    ]  # rdc_hardware_units
    assert plugins.hardware_units("vendor.example/gpu=0", inventory) is None
