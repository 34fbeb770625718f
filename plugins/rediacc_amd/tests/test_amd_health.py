"""AMD GPU health: the resets amdgpu reports in the kernel log hold the card back."""

from __future__ import annotations

import pytest
from rediacc_amd.health import reset_events
from rediacc_amd.testing import two_amd_gpus

from rediacc_core.health import read_health, record_events, unhealthy_cards
from rediacc_core.inventory import read_inventory
from rediacc_core.plugins import load_plugins
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine

# As amdgpu prints them (dmesg form), with the lines around a recovery that are not resets.
LOG = [
    "[31327.729436] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=613206, "
    "emitted seq=613208",
    "[31327.730545] amdgpu 0000:03:00.0: amdgpu: GPU reset begin!",
    "[31328.118201] amdgpu 0000:03:00.0: amdgpu: MODE1 reset",
    "[31328.274891] amdgpu 0000:03:00.0: amdgpu: GPU reset succeeded, trying to resume",
    "[31328.275168] [drm] VRAM is lost due to GPU reset!",
]


def test_a_reset_line_is_a_fatal_event_of_its_card() -> None:
    (event,) = reset_events(LOG)
    assert (event.pci_bus_id, event.reason, event.fatal) == ("0000:03:00.0", "reset", True)
    assert event.message == "amdgpu 0000:03:00.0: amdgpu: GPU reset begin!" and event.key == LOG[1]


def test_a_failed_reset_is_reported_too() -> None:
    (event,) = reset_events(["[  9.1] amdgpu 0000:83:00.0: amdgpu: GPU reset(2) failed"])
    assert (event.pci_bus_id, event.reason) == ("0000:83:00.0", "reset-failed")


def test_the_plugin_reports_resets_of_its_cards_from_the_machines_log(
    fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "amd")
    two_amd_gpus(fake_machine)
    plugins = load_plugins()
    run_setup(fake_machine.machine, plugins, {})
    fake_machine.write("/var/log/kern.log", "\n".join(LOG) + "\n")
    inventory = read_inventory(fake_machine.machine)
    assert inventory is not None
    events = plugins.health(fake_machine.machine, inventory)  # rdc_health
    assert [e.reason for e in events] == ["reset"]
    held = unhealthy_cards(record_events(fake_machine.machine, events))
    assert list(held) == ["0000:03:00.0"], "the card at 0000:83:00.0 stays healthy"
    assert len(read_health(fake_machine.machine)) == 1
