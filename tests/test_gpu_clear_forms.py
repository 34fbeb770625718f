"""`rdc machine gpu clear --device` takes a card's PCI bus id in every form a person copies one from
(the kernel log's `0000:17:00` and `PCI:0000:17:00`, lspci's `17:00.0`, the inventory's
`0000:17:00.0`), completion offers the cards held back, and `gpu list -o json` says which are."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from setup_kit import FakeVendor, example_gpu

from rediacc_core.cli import cli
from rediacc_core.cli.completion import complete_held_back
from rediacc_core.cli.gpu_health import bus_ids_named
from rediacc_core.config import Config
from rediacc_core.health import read_health, record_events, unhealthy_cards
from rediacc_core.model import HealthEvent
from rediacc_core.testing import FakeMachine

BUSES = {"0000:01:00.0", "0000:02:00.0", "0000:17:00.0"}


@pytest.mark.parametrize("typed", ["0000:17:00.0", "0000:17:00", "PCI:0000:17:00", "17:00.0", "17:00"])
def test_every_form_of_a_bus_id_names_the_card(typed: str) -> None:
    assert bus_ids_named(typed, BUSES) == {"0000:17:00.0"}


def test_a_bus_of_no_card_names_none() -> None:
    assert bus_ids_named("0000:18:00", BUSES) == set()
    assert bus_ids_named("0000:1", BUSES) == set()  # a prefix is no form of a bus id


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def test_clear_takes_the_kernel_logs_form_and_completion_offers_the_cards_held_back(
    vendor: FakeVendor, rdc_config: Path, fake_machine: FakeMachine
) -> None:
    vendor.gpus = [example_gpu(0), example_gpu(1)]
    assert rdc("machine", "add", "box", "--root", str(fake_machine.root)).exit_code == 0
    assert rdc("machine", "setup", "box").exit_code == 0
    machine = Config.load().machine("box")
    line = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
    record_events(machine, [HealthEvent(pci_bus_id="0000:02:00.0", reason="xid-79", message=line, key=line)])

    ctx = click.Context(cli, info_name="rdc")
    ctx.params["name"] = "box"
    offered = [item.value for item in complete_held_back(ctx, click.Option(["--device"]), "")]
    assert offered == ["0000:02:00.0"]

    cleared = rdc("machine", "gpu", "clear", "box", "--device", "PCI:0000:02:00")
    assert cleared.exit_code == 0, cleared.output
    assert unhealthy_cards(read_health(machine)) == {}


def test_gpu_list_as_data_says_which_card_is_held_back(
    vendor: FakeVendor, rdc_config: Path, fake_machine: FakeMachine
) -> None:
    vendor.gpus = [example_gpu(0), example_gpu(1)]
    assert rdc("machine", "add", "box", "--root", str(fake_machine.root)).exit_code == 0
    assert rdc("machine", "setup", "box").exit_code == 0
    line = "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
    record_events(
        Config.load().machine("box"),
        [HealthEvent(pci_bus_id="0000:02:00.0", reason="xid-79", message=line, key=line)],
    )
    for fmt in ("json", "yaml"):
        listed = rdc("machine", "gpu", "list", "box", "-o", fmt)
        assert listed.exit_code == 0, listed.output
        assert "Note: the GPU at 0000:02:00.0 is held back for its health (xid-79, seen" in listed.stderr
        assert "`rdc machine gpu clear box --device 0000:02:00.0`" in listed.stderr
