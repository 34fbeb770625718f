"""The example plugin `docs/hooks.md` quotes, installed with pip as a user would and run for real.

`tests/packages/example_vendor` goes into a private directory; `rdc` processes and the plugin
manager find it through its entry point, never through this repository's import path. Every hook
runs on its way: discovery, the setup option and step, the CDI spec, the typed inventory, hardware
units behind an exclusive grant, the request rule behind a gate decision, health events behind a
refused start, and a chore in the gate's housekeeping round.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packages_kit import env_with, install

from rediacc_core.cdi.registry import Registry
from rediacc_core.gate.decide.containers import Container
from rediacc_core.gate.decide.decider import Decider
from rediacc_core.health import health_path
from rediacc_core.hookspecs import PROJECT
from rediacc_core.inventory import read_inventory
from rediacc_core.plugins import load_plugins, set_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.serve import log_keeper
from rediacc_core.testing import FakeMachine

pytestmark = pytest.mark.slow

KIND = "acme.com/gpu"
CARD0, CARD1 = "0000:41:00.0", "0000:c1:00.0"
HOOKS = [
    "rdc_cdi_specs",
    "rdc_discover",
    "rdc_hardware_units",
    "rdc_health",
    "rdc_housekeeping",
    "rdc_request_rules",
    "rdc_setup_options",
    "rdc_setup_steps",
]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install("example_vendor", tmp_path_factory.mktemp("site"))


@pytest.fixture
def lab(make_fake_machine: Any) -> FakeMachine:
    """A machine with two ACME cards, laid out the way the example plugin reads them."""
    fm: FakeMachine = make_fake_machine("lab")
    for index, bdf in enumerate((CARD0, CARD1)):
        pci = fm.pci_device(bdf, 0x1DE5, 0x0001, driver="acme")
        fm.write(f"/sys/class/acme/acme{index}/name", "ACME A1\n")
        fm.write(f"/sys/class/acme/acme{index}/dev", f"240:{index}\n")
        fm.symlink(f"/sys/class/acme/acme{index}/device", pci)
        fm.char_device(f"/dev/acme{index}", 240, index)
    return fm


def rdc(site: Path, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = env_with(site, REDIACC_CONFIG=str(config), REDIACC_LOAD_PLUGINS="example")
    return subprocess.run(
        [sys.executable, "-m", "rediacc_core.cli", *args], env=env, capture_output=True, text=True
    )


def test_rdc_finds_the_installed_plugin_with_every_hook(site: Path, rdc_config: Path) -> None:
    listed = json.loads(rdc(site, rdc_config, "plugins", "-o", "json").stdout)
    assert [(p["name"], p["distribution"], p["hooks"], p["error"]) for p in listed] == [
        ("example", "rediacc-example-vendor", HOOKS, None)
    ]


def test_from_discovery_to_an_exclusive_grant_through_rdc(
    site: Path, rdc_config: Path, lab: FakeMachine
) -> None:
    def ok(*args: str) -> str:
        done = rdc(site, rdc_config, *args)
        assert done.returncode == 0, done.stderr
        return done.stdout

    ok("machine", "add", "lab", "--root", str(lab.root))
    # rdc_setup_options: the plugin's option; rdc_setup_steps: its step, planned then applied.
    assert "--acme-device-mode" in ok("machine", "setup", "--help")
    assert "70-acme.rules" in ok("machine", "setup", "lab", "--dry-run")
    ok("machine", "setup", "lab", "--acme-device-mode", "0666")
    assert lab.path("/etc/udev/rules.d/70-acme.rules").read_text() == 'KERNEL=="acme[0-9]*", MODE="0666"\n'

    # rdc_cdi_specs: a valid spec for both cards and `all`, which the core wrote and now reads.
    registry = Registry.for_machine(lab.machine)
    assert sorted(registry.names()) == [f"{KIND}=0", f"{KIND}=1", f"{KIND}=all"]
    assert registry.devices[f"{KIND}=0"].spec.path == lab.path("/etc/cdi/acme.yaml")

    # rdc_discover, as the inventory recorded it (on disk in its JSON format)...
    document = json.loads(ok("machine", "gpu", "list", "lab", "-o", "json"))
    assert [(g["source"], g["index"], g["pciBusId"], g["cdiNames"]) for g in document["gpus"]] == [
        ("example", 0, CARD0, [f"{KIND}=0", f"{KIND}=all"]),
        ("example", 1, CARD1, [f"{KIND}=1", f"{KIND}=all"]),
    ]
    # ...and as hooks get it, typed.
    inventory = read_inventory(lab.machine)
    assert inventory is not None
    assert [gpu.name for gpu in inventory.from_source("example")] == ["ACME A1", "ACME A1"]

    # rdc_hardware_units: `all` reaches both cards, so it overlaps card 0's exclusive grant.
    repos = RepoStore(lab.machine)
    repos.create("alpha")
    repos.create("beta")
    ok("repo", "gpu", "grant", "alpha@lab", "--device", f"{KIND}=0", "--exclusive")
    ok("repo", "gpu", "grant", "beta@lab", "--device", f"{KIND}=1")
    refused = rdc(site, rdc_config, "repo", "gpu", "grant", "beta@lab", "--device", f"{KIND}=all")
    assert refused.returncode == 4, refused.stderr
    assert f"pci:{CARD0}" in refused.stderr and "alpha" in refused.stderr


def test_the_gate_decides_with_the_plugins_request_rule(
    site: Path, lab: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(site))  # where entry points are looked up, as on a user's machine
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "example")
    plugins = load_plugins()
    assert plugins.names() == ["example"] and plugins.pm.project_name == PROJECT
    from rediacc_core.setup import run_setup

    run_setup(lab.machine, plugins, {"acme_device_mode": "0660"})
    repo = RepoStore(lab.machine).create("alpha")
    log: list[str] = []
    grants = frozenset({f"{KIND}=1"})
    decider = Decider(lab.machine, repo, plugins, lambda image: None, log.append, grants=lambda _: grants)

    def create(host_config: dict[str, Any]) -> Any:
        body = json.dumps({"Image": "busybox", "HostConfig": host_config}).encode()
        return decider.decide("POST", "/v1.45/containers/create", "application/json", body)

    raw = create({"Devices": [{"PathOnHost": "/dev/acme0", "PathInContainer": "/dev/acme0"}]})
    assert not raw.forward and raw.status == 403 and raw.rules == ("raw-device",)
    assert "ACME cards reach containers as CDI devices" in raw.message
    assert f"grant it first: rdc repo gpu grant {repo.ref} --device {KIND}=0" in raw.message
    assert raw.message.endswith(f"use instead: --device {KIND}=0")

    granted = create({"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [f"{KIND}=1"]}]})
    assert granted.forward, granted.message
    ungranted = create({"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [f"{KIND}=0"]}]})
    assert not ungranted.forward and f"no grant for {KIND}=0" in ungranted.message


class TwoContainers:
    """The repo daemon as the gate's lookup sees it: `on0` holds card 0, `on1` card 1."""

    def lookup(self, ref: str) -> Container | None:
        return {
            "on0": Container("a" * 64, "on0", (f"{KIND}=0",)),
            "on1": Container("b" * 64, "on1", (f"{KIND}=1",)),
        }.get(ref)

    def exec_container(self, exec_id: str) -> str | None:
        return None


def test_the_plugins_health_events_hold_its_card_back_until_cleared(
    site: Path, rdc_config: Path, lab: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "example")
    plugins = load_plugins()
    from rediacc_core.setup import run_setup

    run_setup(lab.machine, plugins, {"acme_device_mode": "0660"})
    lab.write("/var/log/kern.log", f"[  812.250731] acme {CARD0}: card fault 7\n")
    repo = RepoStore(lab.machine).create("alpha")
    grants = frozenset({f"{KIND}=0", f"{KIND}=1"})
    decider = Decider(
        lab.machine, repo, plugins, lambda image: None, lambda line: None,
        grants=lambda _: grants, containers=TwoContainers(),
    )  # fmt: skip

    def start(name: str) -> Any:
        return decider.decide("POST", f"/v1.45/containers/{name}/start", None, b"")

    refused = start("on0")
    assert refused.rules == ("gpu-health",) and f"reaches the GPU at {CARD0}" in refused.message
    assert "reported fault-7 (acme 0000:41:00.0: card fault 7)" in refused.message
    assert start("on1").forward, "the other card is healthy"
    # What the runtime guard reads: the card's own names, not `all`, which the healthy card shares.
    assert json.loads(health_path(lab.machine).read_text())["heldNames"] == [f"{KIND}=0"]

    def ok(*args: str) -> subprocess.CompletedProcess[str]:
        done = rdc(site, rdc_config, *args)
        assert done.returncode == 0, done.stderr
        return done

    ok("machine", "add", "lab", "--root", str(lab.root))
    listing = ok("machine", "gpu", "list", "lab").stdout
    assert "Unhealthy GPUs" in listing and "fault-7" in listing
    ok("machine", "gpu", "clear", "lab", "--device", f"{KIND}=0")
    assert start("on0").forward


def test_the_plugins_chore_runs_in_every_round_of_the_gates_housekeeping(
    site: Path, lab: FakeMachine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "example")
    repo = RepoStore(lab.machine).create("alpha")
    set_plugins(load_plugins())  # the gate's own plugins, as a gate process loads them
    try:
        said: list[str] = []
        keeper = log_keeper(lab.machine, repo, said.append)
        beat = lab.machine.path(f"/run/acme/gates/{repo.id}")
        keeper.check()
        assert beat.exists() and f"acme: watchdog told of repo {repo.id}" in said
        beat.write_text("0\n")
        keeper.check()  # the next round: the same chore, no new start
        assert beat.read_text() != "0\n" and said.count(f"acme: watchdog told of repo {repo.id}") == 1
    finally:
        set_plugins(None)
