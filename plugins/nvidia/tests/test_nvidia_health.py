"""NVIDIA GPU health end to end: XID lines in the machine's kernel log make a card unhealthy, its next
container start is refused, application XIDs are ignored, and `rdc machine gpu clear` lets it start
again."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner
from rediacc_nvidia import health

from rediacc_core.cli import cli
from rediacc_core.gate.decide.containers import Container
from rediacc_core.gate.decide.decider import Decider, Decision
from rediacc_core.health import health_path, read_health
from rediacc_core.inventory import read_inventory
from rediacc_core.plugins import Plugins, load_plugins, set_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.health_watch import refresh_health
from rediacc_core.settings import set_setting
from rediacc_core.testing import FakeMachine

CARD = "0000:00:04.0"  # the A100 of the capture
# Line shapes as the driver writes them (dmesg form): the address has no function number.
XID_79 = "[ 5123.456789] NVRM: Xid (PCI:0000:00:04): 79, pid=2411, name=python3, GPU has fallen off the bus."
XID_48 = (
    "[ 6001.000100] NVRM: Xid (PCI:0000:00:04): 48, pid=2411, name=python3, An uncorrectable double bit "
    "error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0."
)
APPLICATION = [
    "[  100.000001] NVRM: Xid (PCI:0000:00:04): 13, pid=901, name=python3, Graphics SM Warp Exception on "
    "(GPC 0, TPC 0, SM 0): Out Of Range Address",
    "[  100.000002] NVRM: Xid (PCI:0000:00:04): 31, pid=901, name=python3, Ch 00000008, intr 10000000. "
    "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_00000000. Fault is of type FAULT_PDE",
    "[  100.000003] NVRM: Xid (PCI:0000:00:04): 43, pid=901, name=python3, Ch 00000010",
    "[  100.000004] NVRM: Xid (PCI:0000:00:04): 45, pid=901, name=python3, Ch 00000010",
    "[  100.000005] NVRM: Xid (PCI:0000:00:04): 68, pid=901, name=python3, NVDEC0 Exception: Error",
    "[  100.000006] NVRM: Xid (PCI:0000:00:04): 109, pid=901, name=python3, Ch 00000010, errorString CTX "
    "SWITCH TIMEOUT",
]


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Iterator[Plugins]:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "nvidia")
    chosen = load_plugins()
    set_plugins(chosen)  # the `rdc` commands below ask the same plugins
    yield chosen
    set_plugins(None)


@pytest.fixture
def a100(plugins: Plugins, set_up_mig_a100: Callable[[Plugins], FakeMachine]) -> FakeMachine:
    fm = set_up_mig_a100(plugins)
    return fm


def kernel_log(fm: FakeMachine, *lines: str) -> None:
    """Lines the kernel logged since boot, where a directory-rooted machine keeps them."""
    fm.write("/var/log/kern.log", "".join(f"{line}\n" for line in lines))


class OneContainer:
    """The repo daemon as the gate's container lookup sees it: `trainer`, holding `names`."""

    def __init__(self, *names: str) -> None:
        self.held_now = Container("c1" * 32, "trainer", names)

    def lookup(self, ref: str) -> Container | None:
        return self.held_now if ref in ("trainer", self.held_now.id) else None

    def exec_container(self, exec_id: str) -> str | None:
        return None


def decider(fm: FakeMachine, plugins: Plugins, *names: str) -> Decider:
    repo = RepoStore(fm.machine).create("alpha")
    return Decider(
        fm.machine,
        repo,
        plugins,
        lambda image: None,
        lambda line: None,
        grants=lambda _: frozenset(names),
        containers=OneContainer(*names),
    )


def start(gate: Decider) -> Decision:
    return gate.decide("POST", "/v1.45/containers/trainer/start", None, b"")


def test_an_xid_holds_the_card_back_until_it_is_cleared(
    a100: FakeMachine, plugins: Plugins, rdc_config: Path
) -> None:
    gate = decider(a100, plugins, "nvidia.com/gpu=0:1")  # a MIG slice of the card reaches it too
    kernel_log(a100, *APPLICATION)
    assert start(gate).forward, "application XIDs leave the card healthy"
    assert read_health(a100.machine) == []

    kernel_log(a100, *APPLICATION, XID_79)
    refused = start(gate)
    assert not refused.forward and refused.status == 403 and refused.rules == ("gpu-health",)
    assert f"container trainer holds nvidia.com/gpu=0:1, which reaches the GPU at {CARD}" in refused.message
    assert "reported xid-79 (NVRM: Xid (PCI:0000:00:04): 79" in refused.message
    assert "rdc machine gpu clear a100 --device nvidia.com/gpu=0:1" in refused.message
    held_names = json.loads(health_path(a100.machine).read_text())["heldNames"]
    assert {"nvidia.com/gpu=0", "nvidia.com/gpu=0:0", "nvidia.com/gpu=0:1"} <= set(held_names)

    runner = CliRunner()
    assert runner.invoke(cli, ["machine", "add", "a100", "--root", str(a100.root)]).exit_code == 0
    listing = runner.invoke(cli, ["machine", "gpu", "list", "a100"])
    assert listing.exit_code == 0, listing.output
    assert "Unhealthy GPUs (containers holding them are refused at start" in listing.stdout
    assert CARD in listing.stdout.split("Unhealthy GPUs")[1] and "xid-79" in listing.stdout

    # Cleared as the refusal advised, the command run as printed.
    cleared = runner.invoke(cli, ["machine", "gpu", "clear", "a100", "--device", "nvidia.com/gpu=0:1"])
    assert cleared.exit_code == 0, cleared.output
    assert f"Cleared the GPU at {CARD} (xid-79): containers holding it may start again." in cleared.stderr
    assert start(gate).forward, "the same log line, read again, stays cleared"

    kernel_log(a100, *APPLICATION, XID_79, XID_48)  # a new fault holds it back again
    assert start(gate).rules == ("gpu-health",)
    again = runner.invoke(cli, ["machine", "gpu", "clear", "a100", "--device", CARD, "-o", "json"])
    assert [e["reason"] for e in json.loads(again.stdout)] == ["xid-48"]
    nothing = runner.invoke(cli, ["machine", "gpu", "clear", "a100"])
    assert "No GPU is held back for its health on a100: nothing to clear." in nothing.stderr


def test_the_report_setting_shows_the_card_but_lets_it_start(
    a100: FakeMachine, plugins: Plugins, rdc_config: Path
) -> None:
    gate = decider(a100, plugins, "nvidia.com/gpu=0")
    kernel_log(a100, XID_79)
    set_setting(a100.machine, "gpu-health", "report")
    assert start(gate).forward
    set_setting(a100.machine, "gpu-health", "refuse")
    assert start(gate).rules == ("gpu-health",)
    runner = CliRunner()
    runner.invoke(cli, ["machine", "add", "a100", "--root", str(a100.root)])
    set_setting(a100.machine, "gpu-health", "report")
    listing = runner.invoke(cli, ["machine", "gpu", "list", "a100"])
    assert "shown only: the machine's gpu-health setting is report" in listing.stdout


def test_gpu_list_shows_what_gates_recorded_and_scan_reads_the_log_now(
    a100: FakeMachine, plugins: Plugins, rdc_config: Path
) -> None:
    runner = CliRunner()
    runner.invoke(cli, ["machine", "add", "a100", "--root", str(a100.root)])
    kernel_log(a100, XID_79)
    assert "Unhealthy GPUs" not in runner.invoke(cli, ["machine", "gpu", "list", "a100"]).stdout
    scanned = runner.invoke(cli, ["machine", "gpu", "list", "a100", "--scan"])
    assert scanned.exit_code == 0 and "xid-79" in scanned.stdout.split("Unhealthy GPUs")[1]


def test_the_gates_housekeeping_round_records_the_events(a100: FakeMachine, plugins: Plugins) -> None:
    kernel_log(a100, XID_79)
    problems: list[str] = []
    refresh_health(a100.machine, plugins, problems.append)
    assert problems == [] and [r.event.reason for r in read_health(a100.machine)] == ["xid-79"]


def test_an_unknown_device_to_clear_says_where_the_names_are(a100: FakeMachine, rdc_config: Path) -> None:
    runner = CliRunner()
    runner.invoke(cli, ["machine", "add", "a100", "--root", str(a100.root)])
    wrong = runner.invoke(cli, ["machine", "gpu", "clear", "a100", "--device", "nvidia.com/gpu=7"])
    assert wrong.exit_code == 2
    assert "'nvidia.com/gpu=7' names no GPU of machine a100" in wrong.stderr
    assert "rdc machine gpu list a100" in wrong.stderr


def test_xid_lines_of_every_driver_generation_are_read() -> None:
    events = health.xid_events(
        [
            XID_79,
            "NVRM: Xid (0000:3B:00): 62, Internal micro-controller halt",  # before 400: no `PCI:`
            "[ 7.1] NVRM: Xid (PCI:0001:3b:00): 94, pid=1, name=x, Contained ECC error.",
            *APPLICATION,
            "[ 7.2] NVRM: GPU at PCI:0000:00:04: GPU-27b94a00-ed54-5c24-b1fd-1054085de32a",
        ]
    )
    assert [(e.pci_bus_id, e.reason, e.fatal) for e in events] == [
        (CARD, "xid-79", True),
        ("0000:3b:00.0", "xid-62", True),
        ("0001:3b:00.0", "xid-94", True),
    ]
    assert events[0].key == XID_79 and events[0].message.startswith("NVRM: Xid (PCI:0000:00:04): 79")


def test_uncorrected_ecc_errors_from_nvml() -> None:
    counts = {0: 0, 1: 3}

    def card(index: int) -> Any:
        return index

    nvml = SimpleNamespace(
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=card,
        nvmlDeviceGetTotalEccErrors=lambda handle, kind, counter: counts[handle],
        nvmlDeviceGetPciInfo=lambda handle: SimpleNamespace(busId=f"00000000:{handle + 1:02X}:00.0".encode()),
    )
    (event,) = health.ecc_events(nvml)
    assert (event.pci_bus_id, event.reason, event.fatal) == ("0000:02:00.0", "ecc-uncorrected", True)
    assert "3 uncorrected ECC error(s)" in event.message


def test_only_cards_of_the_inventory_are_reported(a100: FakeMachine, plugins: Plugins) -> None:
    kernel_log(
        a100, XID_79, "[ 9.9] NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=x, GPU has fallen off the bus."
    )
    inventory = read_inventory(a100.machine)
    assert inventory is not None
    assert [e.pci_bus_id for e in plugins.health(a100.machine, inventory)] == [CARD]
