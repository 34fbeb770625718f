"""The plugin as the core loads it: entry point `nvidia`, every hook, and a whole `machine setup`."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from rediacc_nvidia import testing

from rediacc_core import ApiRequest, Refusal
from rediacc_core.cli import cli
from rediacc_core.errors import RefusedError, ToolError
from rediacc_core.grants.store import GrantStore
from rediacc_core.inventory import load_inventory, read_inventory
from rediacc_core.machine import Machine
from rediacc_core.plugins import Plugins, load_plugins
from rediacc_core.repos import RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine

XML_A100 = "nvidia-smi-q-x/a100-sxm4-40gb-mig_510.47.03.xml"
HOOKS = (
    "rdc_cdi_specs",
    "rdc_discover",
    "rdc_hardware_units",
    "rdc_health",
    "rdc_request_rules",
    "rdc_setup_options",
    "rdc_setup_steps",
)


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "nvidia")
    return load_plugins()


def test_entry_point_loads_with_every_hook(plugins: Plugins) -> None:
    (info,) = plugins.infos
    assert (info.name, info.distribution, info.error) == ("nvidia", "rediacc-nvidia", None)
    assert info.hooks == HOOKS


def test_setup_option(plugins: Plugins) -> None:
    (option,) = plugins.setup_options()
    assert option.opts == ["--install-nvidia-toolkit"]
    assert option.name == "install_nvidia_toolkit" and option.default == "auto"
    assert list(getattr(option.type, "choices", ())) == ["auto", "true", "false"]


def test_setup_writes_the_spec_and_the_inventory_with_mig_names(
    plugins: Plugins, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("a100")
    testing.nvidia_machine(
        fm, capture(XML_A100), compute_caps=["8.0"], mig_profiles={0: ["3g.20gb", "3g.20gb"]}
    )
    report = run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    assert [gpu.name for gpu in report.gpus] == ["NVIDIA A100-SXM4-40GB"]
    assert fm.machine.cdi_dir / "nvidia.yaml" in report.written
    inventory = load_inventory(fm.machine)
    assert inventory is not None
    (gpu,) = inventory["gpus"]
    assert gpu["cdiNames"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"]
    assert [p["cdiNames"][0] for p in gpu["partitions"]] == ["nvidia.com/gpu=0:0", "nvidia.com/gpu=0:1"]
    assert [p["profile"] for p in gpu["partitions"]] == ["3g.20gb", "3g.20gb"]
    assert "nvidia.com/gpu=all" in {device["name"] for device in inventory["devices"]}

    # The hook that reads the inventory, given it typed as the core reads it, through the typed facade.
    typed = read_inventory(fm.machine)
    assert typed is not None
    assert plugins.hardware_units("nvidia.com/gpu=0:1", typed) == ["pci:0000:00:04.0/mig:1"]
    assert plugins.hardware_units("nvidia.com/gpu=all", typed) == ["pci:0000:00:04.0"]


def test_dry_run_prints_the_plan_and_changes_nothing(
    plugins: Plugins,
    capture: Callable[[str], str],
    make_fake_machine: Callable[[str], FakeMachine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Machine, "is_host", property(lambda self: True))  # only the host installs packages
    fm = make_fake_machine("dry")
    monkeypatch.setenv("PATH", f"{fm.bin_dir}:{os.environ['PATH']}")  # a host's tools are on PATH
    testing.nvidia_machine(fm, capture(XML_A100), toolkit=False)
    testing.package_manager(fm, "apt")
    report = run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"}, dry_run=True)
    lines = [line for step in report.plan for line in step.lines]
    assert "run: DEBIAN_FRONTEND=noninteractive apt-get install -y nvidia-container-toolkit" in lines
    assert any(line.startswith("write ") and "nvidia-cdi-refresh.env" in line for line in lines)
    assert not (fm.bin_dir / "nvidia-ctk").exists()
    assert not fm.machine.cdi_dir.exists() or not any(fm.machine.cdi_dir.iterdir())


def test_dry_run_of_a_directory_rooted_machine_plans_no_package_install(
    plugins: Plugins, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("dir")
    testing.nvidia_machine(fm, capture(XML_A100), toolkit=False)
    log = testing.package_manager(fm, "apt")
    report = run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"}, dry_run=True)
    lines = [line for step in report.plan for line in step.lines]
    assert not any("apt-get" in line or "curl" in line or "fetch " in line for line in lines)
    assert any(
        line.startswith("refuse: nvidia-ctk is not among the machine's own tools and machine dir's root is")
        for line in lines
    )
    with pytest.raises(ToolError, match="setup never installs packages for such a machine"):
        run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    assert log.read_text() == ""


def test_setup_installs_the_toolkit_then_generates(
    plugins: Plugins,
    capture: Callable[[str], str],
    make_fake_machine: Callable[[str], FakeMachine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(Machine, "is_host", property(lambda self: True))  # only the host installs packages
    fm = make_fake_machine("fresh")
    monkeypatch.setenv("PATH", f"{fm.bin_dir}:{os.environ['PATH']}")  # a host's tools are on PATH
    testing.nvidia_machine(fm, capture(XML_A100), toolkit=False)
    log = testing.package_manager(fm, "apt")
    run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    assert "apt-get install -y nvidia-container-toolkit" in log.read_text()
    assert (fm.machine.cdi_dir / "nvidia.yaml").exists()


def test_failing_nvidia_ctk_fails_setup_and_keeps_the_old_spec(
    plugins: Plugins, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("failing")
    testing.nvidia_machine(fm, capture(XML_A100))
    run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    before = (fm.machine.cdi_dir / "nvidia.yaml").read_text()
    testing.break_ctk(fm, "fail")
    with pytest.raises(ToolError, match="failed to initialize NVML"):
        run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    assert (fm.machine.cdi_dir / "nvidia.yaml").read_text() == before


def test_request_rules_through_the_facade(
    plugins: Plugins, make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    from rediacc_core import GateContext

    fm = make_fake_machine("gate")
    ctx = GateContext("a", "a@gate", fm.machine, frozenset(), None, {}, lambda image: None, lambda line: None)
    body = {"Image": "x", "HostConfig": {"Runtime": "nvidia"}}
    (refusal,) = plugins.request_rules(ApiRequest("POST", "/containers/create", {}, body), ctx)
    assert isinstance(refusal, Refusal) and refusal.rule == "runtime"


def test_setup_of_the_demo_machine_runs_again_from_any_shell(rdc_config: Path, tmp_path: Path) -> None:
    # The demo's stand-ins are the machine's own tools: no PATH of the demo's is needed afterwards.
    runner = CliRunner()
    demo = runner.invoke(cli, ["demo", "--workdir", str(tmp_path / "demo")])
    assert demo.exit_code == 0, demo.output
    path_before = os.environ["PATH"]
    again = runner.invoke(cli, ["machine", "setup", "demo"])
    assert again.exit_code == 0, again.output
    assert os.environ["PATH"] == path_before
    listing = runner.invoke(cli, ["machine", "gpu", "list", "demo", "-o", "json"])
    assert any(g["vendor"] == "nvidia" for g in json.loads(listing.stdout)["gpus"])


def test_setup_without_the_toolkit_says_which_gpus_are_not_grantable_and_how(
    rdc_config: Path, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("notk")
    testing.nvidia_machine(fm, capture(XML_A100), toolkit=False)
    runner = CliRunner()
    assert runner.invoke(cli, ["machine", "add", "notk", "--root", str(fm.root)]).exit_code == 0
    advice = "to make them grantable: rdc machine setup notk --install-nvidia-toolkit=auto"
    dry = runner.invoke(cli, ["machine", "setup", "notk", "--install-nvidia-toolkit=false", "--dry-run"])
    assert dry.exit_code == 0 and advice in dry.output
    done = runner.invoke(cli, ["machine", "setup", "notk", "--install-nvidia-toolkit=false"])
    assert done.exit_code == 0, done.output
    assert (
        "1 GPU(s) no CDI spec names, so not grantable (NVIDIA A100-SXM4-40GB at 0000:00:04.0)" in done.stderr
    )
    listing = runner.invoke(cli, ["machine", "gpu", "list", "notk"])
    assert "(none: no CDI spec names it)" in listing.stdout


def test_an_exclusive_reservation_fails_closed_on_a_name_the_inventory_places_nowhere(
    plugins: Plugins, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    """The facts disagree: the spec names MIG device 0:0, an inventory rebuilt without MIG does not
    place it. Exclusivity cannot follow its hardware, so it must not pass (it reaches GPU 0)."""
    fm = make_fake_machine("drift")
    testing.nvidia_machine(
        fm, capture(XML_A100), compute_caps=["8.0"], mig_profiles={0: ["3g.20gb", "3g.20gb"]}
    )
    run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    document = json.loads(fm.machine.inventory_path.read_text())
    for gpu in document["gpus"]:
        gpu["partitions"] = []  # what a setup from /proc alone records
    fm.machine.inventory_path.write_text(json.dumps(document))
    repos = RepoStore(fm.machine)
    alpha, beta = repos.create("alpha"), repos.create("beta")
    store = GrantStore(fm.machine, plugins, running=Holdings(fm.machine))
    store.grant(beta, ["nvidia.com/gpu=0"], exclusive=True)
    with pytest.raises(RefusedError, match="places it on no hardware it knows"):
        store.grant(alpha, ["nvidia.com/gpu=0:0"], exclusive=True)
    with pytest.raises(RefusedError, match=re.escape("places nvidia.com/gpu=0:0 or nvidia.com/gpu=0 on no")):
        store.grant(alpha, ["nvidia.com/gpu=0:0"])
    assert [g.repo_id for g in store.all()] == [beta.id]
