"""The inventory file: built from discovery and the specs on the machine, checked on every read and write."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from setup_kit import KIND, example_gpu, spec_document

from rediacc_core import GpuPartition
from rediacc_core.cdi.registry import Registry
from rediacc_core.cdi.spec import write_spec
from rediacc_core.errors import ValidationError
from rediacc_core.files import schema_errors
from rediacc_core.inventory import (
    SCHEMA,
    age,
    build_inventory,
    load_inventory,
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
    partition = GpuPartition(2, "MIG-aa", "1g.10gb", 9984, (f"{KIND}=0:2",), {"giId": 2})
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
