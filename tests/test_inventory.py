"""The inventory file: built from discovery and the specs on the machine, checked on every read and write."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest
from setup_kit import KIND, example_gpu, spec_document

from rediacc_core import CdiDevice, Gpu, GpuPartition, Inventory, Machine
from rediacc_core.cdi.registry import Registry
from rediacc_core.cdi.spec import write_spec
from rediacc_core.errors import ValidationError
from rediacc_core.files import schema_errors
from rediacc_core.inventory import (
    SCHEMA,
    LiveInventory,
    age,
    build_inventory,
    check_inventory,
    inventory_from_document,
    load_inventory,
    read_inventory,
    read_inventory_text,
    write_inventory,
)
from rediacc_core.testing import FakeMachine

NOW = datetime(2026, 11, 30, 6, 0, 0, tzinfo=UTC)


def test_a_machine_never_set_up_has_no_inventory(fake_machine: FakeMachine) -> None:
    assert load_inventory(fake_machine.machine) is None


def test_the_inventory_records_each_gpu_in_camel_case_and_every_name_the_specs_define(
    fake_machine: FakeMachine,
) -> None:
    write_spec(fake_machine.path("/etc/cdi/example.yaml"), spec_document(fake_machine, ["0", "1"]))
    partition = GpuPartition(
        index=2,
        uuid="MIG-aa",
        profile="1g.10gb",
        memory_mib=9984,
        cdi_names=(f"{KIND}=0:2",),
        attributes={"giId": 2},
    )
    gpu = example_gpu(0, partitions=[partition], computeCapability="9.0")

    doc = build_inventory(fake_machine.machine, [gpu], Registry.for_machine(fake_machine.machine), now=NOW)

    assert doc == {
        "schemaVersion": 1,
        "generatedAt": "2026-11-30T06:00:00Z",
        "machine": "fake",
        "platform": "native",
        "gpus": [
            {
                "vendor": "example",
                "source": "fakevendor",
                "name": "Example GPU 0",
                "index": 0,
                "pciBusId": "0000:01:00.0",
                "driver": "examplegpu",
                "driverVersion": "550.54.14",
                "memoryMiB": 81559,
                "cdiNames": [f"{KIND}=0"],  # `=all` is not defined by any spec, so it is not offered
                "attributes": {"uuid": "GPU-00000000", "computeCapability": "9.0"},
                "partitions": [
                    {
                        "index": 2,
                        "uuid": "MIG-aa",
                        "profile": "1g.10gb",
                        "memoryMiB": 9984,
                        "cdiNames": [],
                        "attributes": {"giId": 2},
                    }
                ],
            }
        ],
        "devices": [
            {"name": f"{KIND}=0", "kind": KIND, "spec": "example.yaml"},
            {"name": f"{KIND}=1", "kind": KIND, "spec": "example.yaml"},
        ],
    }
    assert schema_errors(doc, SCHEMA) == []


def test_wsl_machines_say_so(fake_machine: FakeMachine) -> None:
    fake_machine.char_device("/dev/dxg", 10, 63)

    doc = build_inventory(fake_machine.machine, [], Registry.for_machine(fake_machine.machine))

    assert doc["platform"] == "wsl"


def test_written_inventory_reads_back_and_its_text_is_kept_as_recorded(fake_machine: FakeMachine) -> None:
    doc = build_inventory(fake_machine.machine, [example_gpu(1)], Registry.for_machine(fake_machine.machine))

    write_inventory(fake_machine.machine, doc)

    assert load_inventory(fake_machine.machine) == doc
    assert read_inventory_text(fake_machine.machine) == fake_machine.machine.inventory_path.read_text()


def test_an_invalid_document_is_never_written(fake_machine: FakeMachine) -> None:
    good = build_inventory(fake_machine.machine, [], Registry.for_machine(fake_machine.machine), now=NOW)
    write_inventory(fake_machine.machine, good)
    before = fake_machine.machine.inventory_path.read_bytes()

    with pytest.raises(ValidationError, match=r"at \$\.platform"):
        write_inventory(fake_machine.machine, {**good, "platform": "mainframe"})

    assert fake_machine.machine.inventory_path.read_bytes() == before


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{not json", "is not valid JSON"),
        ('{"schemaVersion": 1}', "does not match its schema"),
        ('{"schemaVersion": 7, "gpus": []}', "schemaVersion 7, newer than this rdc understands"),
        ("[]", "does not match its schema"),
    ],
)
def test_a_broken_inventory_is_an_error_naming_the_file_never_no_gpus(
    fake_machine: FakeMachine, text: str, expected: str
) -> None:
    fake_machine.write("/etc/rediacc/gpu/inventory.json", text)

    with pytest.raises(ValidationError) as caught:
        load_inventory(fake_machine.machine)

    assert expected in caught.value.what
    assert str(fake_machine.machine.inventory_path) in caught.value.what
    assert "rdc machine setup" in caught.value.todo


def test_vendor_attributes_must_be_plain_values(fake_machine: FakeMachine) -> None:
    doc = build_inventory(fake_machine.machine, [example_gpu(0)], Registry.for_machine(fake_machine.machine))
    doc["gpus"][0]["attributes"]["nested"] = {"no": "objects"}

    with pytest.raises(ValidationError, match="attributes"):
        write_inventory(fake_machine.machine, doc)


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        (timedelta(seconds=3), "just now"),
        (timedelta(seconds=42), "42s ago"),
        (timedelta(minutes=3, seconds=59), "3m ago"),
        (timedelta(hours=5), "5h ago"),
        (timedelta(days=2, hours=3), "2d ago"),
        (timedelta(minutes=-5), "in the future"),
    ],
)
def test_age_reads_the_way_people_say_it(delta: timedelta, expected: str) -> None:
    assert age("2026-11-30T06:00:00Z", now=NOW + delta) == expected


def test_generated_at_is_utc_iso8601(fake_machine: FakeMachine) -> None:
    doc = build_inventory(fake_machine.machine, [], Registry.for_machine(fake_machine.machine))

    parsed = datetime.fromisoformat(doc["generatedAt"].replace("Z", "+00:00"))
    assert parsed.utcoffset() == timedelta(0)
    assert json.loads(json.dumps(doc)) == doc


# --- the typed Inventory hooks get ---------------------------------------------------------------


def test_the_typed_inventory_is_the_recorded_document_read_back(fake_machine: FakeMachine) -> None:
    write_spec(fake_machine.path("/etc/cdi/example.yaml"), spec_document(fake_machine, ["0", "0:2"]))
    partition = GpuPartition(index=2, uuid="MIG-aa", cdi_names=(f"{KIND}=0:2",), attributes={"giId": 2})
    gpu = example_gpu(0, partitions=[partition])
    registry = Registry.for_machine(fake_machine.machine)
    write_inventory(fake_machine.machine, build_inventory(fake_machine.machine, [gpu], registry, now=NOW))

    inventory = read_inventory(fake_machine.machine)

    assert inventory is not None
    assert (inventory.machine, inventory.platform, inventory.generated_at) == (
        "fake",
        "native",
        "2026-11-30T06:00:00Z",
    )
    # Exactly the discovered GPU, less the CDI names no spec defines (`=all`).
    assert inventory.gpus == (dataclasses.replace(gpu, cdi_names=(f"{KIND}=0",)),)
    assert inventory.devices == (
        CdiDevice(name=f"{KIND}=0", kind=KIND, spec="example.yaml"),
        CdiDevice(name=f"{KIND}=0:2", kind=KIND, spec="example.yaml"),
    )
    assert read_inventory(Machine("never-set-up", fake_machine.root / "elsewhere")) is None


def test_an_inventory_written_by_an_earlier_version_reads_as_typed() -> None:
    # A file from before the typed inventory existed, byte for byte as rdc 0.1.0 wrote it.
    document = json.loads(
        '{"schemaVersion": 1, "generatedAt": "2026-11-01T10:00:00Z", "machine": "m1", "platform": "wsl",'
        ' "gpus": [{"vendor": "example", "source": "fakevendor", "name": "Example", "index": null,'
        ' "pciBusId": null, "driver": null, "driverVersion": null, "memoryMiB": null,'
        ' "cdiNames": ["vendor.example/gpu=all"], "attributes": {"wddm": true}, "partitions": []}],'
        ' "devices": [{"name": "vendor.example/gpu=all", "kind": "vendor.example/gpu", "spec": "x.yaml"}]}'
    )
    check_inventory(document, "old.json")

    inventory = inventory_from_document(document)

    (gpu,) = inventory.gpus
    assert gpu.index is None and gpu.attributes == {"wddm": True}
    assert inventory.names_of_kind("vendor.example/gpu") == ("vendor.example/gpu=all",)
    assert inventory.holder("vendor.example/gpu=all") == (gpu, None)


def test_lookups_by_name_source_attribute_and_partition() -> None:
    mig = GpuPartition(index=1, uuid="MIG-1", cdi_names=("vendor.example/gpu=0:1",))
    first = Gpu(
        vendor="example", source="a", name="A", index=0, cdi_names=("vendor.example/gpu=0",),
        attributes={"renderMinor": 128, "flag": True}, partitions=(mig,),
    )  # fmt: skip
    second = Gpu(vendor="example", source="b", name="B", attributes={"renderMinor": 1, "flag": 1})
    inventory = Inventory(gpus=(first, second))

    assert inventory.holder("vendor.example/gpu=0") == (first, None)
    assert inventory.holder("vendor.example/gpu=0:1") == (first, mig)
    assert inventory.holder("vendor.example/gpu=9") is None
    assert inventory.from_source("b") == (second,) and inventory.from_source("c") == ()
    assert inventory.with_attribute("renderMinor", 128) == (first,)
    assert inventory.with_attribute("flag", True) == (first,)  # JSON's true is not 1
    assert inventory.with_attribute("flag", 1) == (second,)
    assert first.partition(1) is mig and first.partition(0) is None
    assert first.int_attribute("renderMinor") == 128 and first.int_attribute("flag") is None
    assert first.str_attribute("renderMinor") is None and Inventory().gpus == ()


def test_gpus_and_partitions_are_built_by_keyword_only() -> None:
    with pytest.raises(TypeError):
        Gpu("example", "a", "A")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        GpuPartition(1)  # type: ignore[call-arg]


def test_the_live_inventory_is_built_once_per_file_version(fake_machine: FakeMachine) -> None:
    registry = Registry.for_machine(fake_machine.machine)
    write_inventory(fake_machine.machine, build_inventory(fake_machine.machine, [example_gpu(0)], registry))
    live = LiveInventory(fake_machine.machine)

    first = live.get()
    assert all(live.get() is first for _ in range(100))  # one stat per call, nothing rebuilt
    assert live.reads == 1

    write_inventory(fake_machine.machine, build_inventory(fake_machine.machine, [], registry))
    assert live.get() is not first and live.reads == 2
    fake_machine.machine.inventory_path.unlink()
    assert live.get() is None
