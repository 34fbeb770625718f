"""The specs and the inventory agree or the difference is said: names no discovered hardware is,
facts a discovery could not read again, and the specs' identity the gate compares per request."""

from __future__ import annotations

import os
from typing import Any

import pytest
from setup_kit import KIND, example_gpu, spec_document

from rediacc_core import hookimpl
from rediacc_core.cdi.registry import Registry, fingerprint
from rediacc_core.cdi.spec import write_spec
from rediacc_core.inventory import build_inventory, inventory_from_document
from rediacc_core.plugins import Plugins, load_plugins
from rediacc_core.spec_facts import SpecAge, lost_facts, recorded, unplaced_names
from rediacc_core.testing import FakeMachine


class _Vendor:
    """Owns the example kind and places a name only where the inventory lists it."""

    @hookimpl
    def rdc_hardware_units(self, name: str, inventory: Any) -> list[str] | None:
        if not name.startswith(f"{KIND}="):
            return None
        holder = inventory.holder(name)
        return [f"cdi:{name}"] if holder is None else [f"pci:{holder[0].pci_bus_id}"]


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    return load_plugins(extra=[("placer", _Vendor())])


def test_a_name_no_discovered_hardware_is_is_recorded_as_not_grantable(
    fake_machine: FakeMachine, plugins: Plugins
) -> None:
    machine = fake_machine.machine
    write_spec(machine.cdi_dir / "example.yaml", spec_document(fake_machine, ["0", "1"]))
    write_spec(
        machine.cdi_dir / "other.yaml", {**spec_document(fake_machine, ["x"]), "kind": "other.example/dev"}
    )
    registry = Registry.for_machine(machine)
    placed = build_inventory(machine, [example_gpu(0)], registry)

    unplaced = unplaced_names(registry, inventory_from_document(placed), plugins)

    # GPU 1 is gone; the name of a kind no plugin owns cannot be judged and stays grantable.
    assert list(unplaced) == [f"{KIND}=1"]
    assert unplaced[f"{KIND}=1"].startswith("example.yaml defines it, but no GPU discovery found")
    document = build_inventory(machine, [example_gpu(0)], registry, unplaced=unplaced)
    assert f"{KIND}=1" not in {d["name"] for d in document["devices"]}
    assert document["ungrantable"][0]["name"] == f"{KIND}=1"


def test_facts_a_discovery_could_not_read_again_are_said_not_carried_over() -> None:
    card = {"source": "acme", "pciBusId": "0000:01:00.0", "name": "ACME X", "memoryMiB": 81559}
    before = {"gpus": [{**card, "attributes": {"uuid": "GPU-1"}, "partitions": [{"cdiNames": ["a/b=0:0"]}]}]}
    now = {"gpus": [{**card, "memoryMiB": None, "attributes": {"uuid": None}, "partitions": []}]}
    (said,) = lost_facts(before, now)
    assert "could not read memory, uuid, 1 partition(s) (a/b=0:0) of ACME X at 0000:01:00.0" in said
    assert lost_facts(before, before) == [] and lost_facts(None, now) == []


def test_the_spec_check_follows_rewrites_additions_and_removals(fake_machine: FakeMachine) -> None:
    machine = fake_machine.machine
    spec = machine.cdi_dir / "example.yaml"
    write_spec(spec, spec_document(fake_machine, ["0"]))
    rows = recorded(fingerprint([machine.cdi_dir]), machine)
    assert [row["file"] for row in rows] == ["example.yaml"]
    age = SpecAge(machine, lambda: rows)
    assert age.check() is None

    write_spec(spec, spec_document(fake_machine, ["0", "1"]))  # atomic: a new inode
    assert "example.yaml changed" in str(age.check())
    assert "rdc machine refresh" not in str(age.check())  # the advice is the caller's (the gate's)

    rows = recorded(fingerprint([machine.cdi_dir]), machine)
    assert age.check() is None  # a new inventory: the rows it records are the ones compared
    with spec.open("a", encoding="utf-8") as same_inode:  # written in place: the dir is unchanged
        same_inode.write("# edited\n")
    assert "example.yaml changed" in str(age.check())
    rows = recorded(fingerprint([machine.cdi_dir]), machine)
    (machine.cdi_dir / "late.json").write_text("{}")
    assert "late.json appeared" in str(age.check())
    os.unlink(machine.cdi_dir / "late.json")
    assert age.check() is None
    spec.unlink()
    assert "example.yaml was removed" in str(age.check())


def test_an_inventory_that_records_no_specs_is_not_judged(fake_machine: FakeMachine) -> None:
    write_spec(fake_machine.machine.cdi_dir / "example.yaml", spec_document(fake_machine, ["0"]))
    assert SpecAge(fake_machine.machine, lambda: None).check() is None
