"""pytest fixtures for rediacc-core and plugin authors (registered through the `pytest11` entry point)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rediacc_core.model import GateContext, Inventory
from rediacc_core.testing import kit
from rediacc_core.testing.fakemachine import FakeMachine


@pytest.fixture
def rdc_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty, private `rdc` config file (`$REDIACC_CONFIG`)."""
    config = tmp_path / "rdc-config.yaml"
    monkeypatch.setenv("REDIACC_CONFIG", str(config))
    return config


@pytest.fixture
def make_fake_machine(tmp_path: Path) -> Callable[[str], FakeMachine]:
    """A factory of simulated machines, each with its stand-in tools under its own root."""

    def make(name: str = "fake") -> FakeMachine:
        return FakeMachine(tmp_path / f"{name}-root", name=name)

    return make


@pytest.fixture
def fake_machine(make_fake_machine: Callable[[str], FakeMachine]) -> FakeMachine:
    """One simulated machine named `fake`."""
    return make_fake_machine("fake")


@pytest.fixture
def inventory_of() -> Callable[..., Inventory]:
    """Build the typed `Inventory` hooks get from `Gpu`s: `inventory_of(gpus, platform="native")`."""
    return kit.inventory_of


@pytest.fixture
def gate_context() -> Callable[..., GateContext]:
    """Build the GateContext a rule hook gets: `gate_context(machine, grants, inventory, ...)`."""
    return kit.gate_context
