"""GPU health records: each reported event is recorded once, a fatal one holds its card back until
cleared, a cleared one stays cleared when read again, the metrics count them, and a gate that cannot
read the records refuses starts of containers holding devices."""

from __future__ import annotations

import json

import pytest

from rediacc_core.health import (
    MAX_EVENTS,
    clear,
    health_path,
    metrics_path,
    read_health,
    record_events,
    unhealthy_cards,
)
from rediacc_core.kernlog import kernel_log, kmsg_line
from rediacc_core.model import HealthEvent
from rediacc_core.testing import FakeMachine

A, B = "0000:3b:00.0", "0000:86:00.0"


def event(card: str, reason: str, key: str, *, fatal: bool = True) -> HealthEvent:
    return HealthEvent(pci_bus_id=card, reason=reason, message=f"{reason} on {card}", key=key, fatal=fatal)


def test_an_event_is_recorded_once_and_a_fatal_one_holds_its_card(fake_machine: FakeMachine) -> None:
    machine = fake_machine.machine
    first = [event(A, "xid-79", "[1.0] a"), event(B, "xid-63", "[1.1] b", fatal=False)]
    record_events(machine, first)
    records = record_events(machine, first)  # seen again: nothing new
    assert len(records) == 2 and len(read_health(machine)) == 2
    assert list(unhealthy_cards(records)) == [A], "a non-fatal event is shown, never held against the card"


def test_a_cleared_event_stays_cleared_and_a_new_one_holds_again(fake_machine: FakeMachine) -> None:
    machine = fake_machine.machine
    record_events(machine, [event(A, "xid-79", "[1.0] a"), event(B, "xid-48", "[1.1] b")])
    (cleared,) = clear(machine, [A])
    assert cleared.event.pci_bus_id == A
    assert list(unhealthy_cards(record_events(machine, [event(A, "xid-79", "[1.0] a")]))) == [B]
    assert sorted(unhealthy_cards(record_events(machine, [event(A, "xid-79", "[9.0] a")]))) == [A, B]
    assert len(clear(machine)) == 2 and unhealthy_cards(read_health(machine)) == {}


def test_the_metrics_count_events_and_unhealthy_cards(fake_machine: FakeMachine) -> None:
    machine = fake_machine.machine
    record_events(machine, [event(A, "xid-79", "1"), event(A, "xid-79", "2"), event(B, "xid-48", "3")])
    clear(machine, [B])
    lines = metrics_path(machine).read_text().splitlines()
    assert 'rediacc_gpu_health_events{pci_bus_id="0000:3b:00.0",reason="xid-79",fatal="true"} 2' in lines
    assert 'rediacc_gpu_health_events{pci_bus_id="0000:86:00.0",reason="xid-48",fatal="true"} 1' in lines
    assert [line for line in lines if line.startswith("rediacc_gpu_unhealthy{")] == [
        'rediacc_gpu_unhealthy{pci_bus_id="0000:3b:00.0"} 1'
    ]


def test_the_oldest_cleared_events_go_first_past_the_bound(fake_machine: FakeMachine) -> None:
    machine = fake_machine.machine
    record_events(machine, [event(A, "xid-79", "held")])
    record_events(machine, [event(B, "xid-48", f"old {n}") for n in range(MAX_EVENTS)])
    clear(machine, [B])
    record_events(machine, [event(B, "xid-48", "new")])
    records = read_health(machine)
    assert len(records) == MAX_EVENTS
    assert {r.event.key for r in records} >= {"held", "new"}, "events still holding a card are kept"


def test_the_records_file_is_checked_on_every_read(fake_machine: FakeMachine) -> None:
    path = health_path(fake_machine.machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schemaVersion": 1, "events": [{"pciBusId": A}]}))
    from rediacc_core.errors import ValidationError

    with pytest.raises(ValidationError, match="GPU health file"):
        read_health(fake_machine.machine)


# --- the kernel's log ------------------------------------------------------------------------------


def test_a_kmsg_record_reads_as_a_dmesg_line() -> None:
    text = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2411, name=python3, GPU has fallen off the bus."
    record = f"3,1289,5123456789,-;{text}\n SUBSYSTEM=pci\n"  # the record's continuation line goes
    assert kmsg_line(record) == f"[ 5123.456789] {text}"
    assert kmsg_line("not a record") is None


def test_a_directory_rooted_machine_keeps_its_kernel_log_in_var_log(fake_machine: FakeMachine) -> None:
    assert kernel_log(fake_machine.machine) == []
    fake_machine.write("/var/log/kern.log", "[    1.000000] first\n[    2.000000] second\n")
    assert kernel_log(fake_machine.machine) == ["[    1.000000] first", "[    2.000000] second"]
