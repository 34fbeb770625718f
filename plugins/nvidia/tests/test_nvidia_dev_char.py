"""The `/dev/char` links setup creates on native NVIDIA machines: once, shown by a dry run, never on WSL."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rediacc_nvidia import testing

from rediacc_core.plugins import Plugins, load_plugins
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine

XML_A100 = "nvidia-smi-q-x/a100-sxm4-40gb-mig_510.47.03.xml"


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "nvidia")
    return load_plugins()


def test_setup_links_the_nodes_in_dev_char_once_and_the_dry_run_shows_it(
    plugins: Plugins, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("links")
    testing.nvidia_machine(fm, capture(XML_A100))
    dry = run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"}, dry_run=True)
    lines = [line for step in dry.plan for line in step.lines]
    command = (
        "run: nvidia-ctk system create-dev-char-symlinks --create-all "
        f"--dev-char-path={fm.path('/dev/char')} --driver-root={fm.root}"
    )
    assert any(line.startswith(command) for line in lines), lines
    assert testing.dev_char_calls(fm) == [] and not fm.path("/dev/char").exists()

    run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    assert len(testing.dev_char_calls(fm)) == 1
    links = {link.name: str(link.readlink()) for link in fm.path("/dev/char").iterdir()}
    assert links["195:0"] == "/dev/nvidia0" and links["195:255"] == "/dev/nvidiactl"

    again = run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
    lines = [line for step in again.plan for line in step.lines]
    assert any(line.endswith("NVIDIA device nodes: nothing to do") for line in lines), lines
    assert len(testing.dev_char_calls(fm)) == 1, "links that exist are not made again"


def test_wsl_makes_no_dev_char_links(
    plugins: Plugins, capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("wsl")
    testing.wsl_machine(fm, capture(XML_A100))
    report = run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"}, dry_run=True)
    assert not any("create-dev-char-symlinks" in line for step in report.plan for line in step.lines)
