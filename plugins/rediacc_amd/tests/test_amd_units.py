"""`rediacc.io/amd` names reach cards or partitions, the same units the render-node names reach."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable

import pytest
from rediacc_amd.discovery import discover
from rediacc_amd.testing import install_kfd_capture, two_amd_gpus
from rediacc_amd.units import hardware_units

from rediacc_core import Gpu, Inventory
from rediacc_core.grants.units import overlapping_units
from rediacc_core.inventory import load_inventory, read_inventory
from rediacc_core.plugins import Plugins, load_plugins
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine

InventoryOf = Callable[[Iterable[Gpu]], Inventory]


def test_gpus_reach_their_cards_and_all_reaches_every_card(
    fake_machine: FakeMachine, inventory_of: InventoryOf
) -> None:
    two_amd_gpus(fake_machine)
    inventory = inventory_of(discover(fake_machine.machine))
    assert hardware_units("rediacc.io/amd=gpu0", inventory) == ["pci:0000:03:00.0"]
    assert hardware_units("rediacc.io/amd=gpu1", inventory) == ["pci:0000:83:00.0"]
    assert hardware_units("rediacc.io/amd=all", inventory) == ["pci:0000:03:00.0", "pci:0000:83:00.0"]


def test_partitions_are_slices_of_their_card(fake_machine: FakeMachine, inventory_of: InventoryOf) -> None:
    install_kfd_capture(fake_machine, "mi308x-cpx")
    inventory = inventory_of(discover(fake_machine.machine))
    assert hardware_units("rediacc.io/amd=gpu5", inventory) == ["pci:0000:80:00.0/partition:1"]
    assert hardware_units("rediacc.io/amd=gpu16", inventory) == ["pci:0001:0b:00.0/partition:0"]
    assert len(hardware_units("rediacc.io/amd=all", inventory) or []) == 8


def test_names_the_inventory_does_not_know_reserve_themselves() -> None:
    assert hardware_units("rediacc.io/amd=gpu3", Inventory()) == ["cdi:rediacc.io/amd=gpu3"]
    assert hardware_units("rediacc.io/amd=all", Inventory()) == ["cdi:rediacc.io/amd=all"]
    assert hardware_units("rediacc.io/dri=renderD128", Inventory()) is None


# --- both plugins, as `rdc machine setup` and exclusive grants use them ----------------------------


@pytest.fixture
def both(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    # The render-node plugin is another distribution: these run where both are installed (tox -e e2e
    # and a developer's tree), and skip in the AMD-only env.
    pytest.importorskip("rediacc_dri", reason="the rediacc-dri plugin is not installed")
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "amd,dri")
    plugins = load_plugins()
    assert plugins.names() == ["amd", "dri"]
    return plugins


def _overlap(plugins: Plugins, inventory: Inventory, a: str, b: str) -> bool:
    units_a = plugins.hardware_units(a, inventory)  # rdc_hardware_units
    units_b = plugins.hardware_units(b, inventory)
    assert units_a and units_b, (a, units_a, b, units_b)
    return bool(overlapping_units(units_a, units_b))


def test_two_cards_overlap_with_their_render_nodes_after_setup(
    fake_machine: FakeMachine, both: Plugins
) -> None:
    two_amd_gpus(fake_machine)
    report = run_setup(fake_machine.machine, both, {})
    assert report.inventory == load_inventory(fake_machine.machine)
    inventory = read_inventory(fake_machine.machine)
    assert inventory is not None
    assert {d.name for d in inventory.devices} == {
        "rediacc.io/amd=gpu0",
        "rediacc.io/amd=gpu1",
        "rediacc.io/amd=all",
        "rediacc.io/dri=renderD128",
        "rediacc.io/dri=renderD129",
    }
    assert _overlap(both, inventory, "rediacc.io/amd=gpu0", "rediacc.io/dri=renderD128")
    assert _overlap(both, inventory, "rediacc.io/amd=gpu1", "rediacc.io/dri=renderD129")
    assert not _overlap(both, inventory, "rediacc.io/amd=gpu0", "rediacc.io/dri=renderD129")
    assert _overlap(both, inventory, "rediacc.io/amd=all", "rediacc.io/dri=renderD129")


def test_partitions_overlap_only_with_their_own_render_node(fake_machine: FakeMachine, both: Plugins) -> None:
    install_kfd_capture(fake_machine, "mi300x-cpx")
    run_setup(fake_machine.machine, both, {})
    inventory = read_inventory(fake_machine.machine)
    assert inventory is not None
    # gpu9 is partition 1 of the card at 27:00.0, on renderD137 (a platform device, no PCI link).
    assert both.hardware_units("rediacc.io/dri=renderD137", inventory) == ["pci:0000:27:00.0/partition:1"]
    assert both.hardware_units("rediacc.io/dri=renderD136", inventory) == ["pci:0000:27:00.0/partition:0"]
    assert _overlap(both, inventory, "rediacc.io/amd=gpu9", "rediacc.io/dri=renderD137")
    assert not _overlap(both, inventory, "rediacc.io/amd=gpu9", "rediacc.io/dri=renderD136")
    assert not _overlap(both, inventory, "rediacc.io/amd=gpu8", "rediacc.io/amd=gpu9")
    assert _overlap(both, inventory, "rediacc.io/amd=all", "rediacc.io/dri=renderD190")


def test_setup_on_a_machine_without_gpus_removes_both_specs(fake_machine: FakeMachine, both: Plugins) -> None:
    two_amd_gpus(fake_machine)
    run_setup(fake_machine.machine, both, {})
    assert sorted(p.name for p in fake_machine.machine.cdi_dir.iterdir()) == [
        "rediacc-amd.yaml",
        "rediacc-dri.yaml",
    ]
    for path in ("/dev/kfd", "/sys/class/drm", "/sys/class/kfd"):
        target = fake_machine.path(path)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink()
    run_setup(fake_machine.machine, both, {})
    assert list(fake_machine.machine.cdi_dir.iterdir()) == []
    inventory = load_inventory(fake_machine.machine)
    assert inventory is not None and inventory["gpus"] == [] and inventory["devices"] == []
