"""`rdc demo` walks the whole data path: grants, an exclusive reservation, and gate decisions."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from setup_kit import KIND, FakeVendor, example_gpu, spec_document

from rediacc_core import CdiSpecFile, SetupContext, hookimpl
from rediacc_core.demo import walkthrough
from rediacc_core.plugins import load_plugins
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine


class UnitsVendor(FakeVendor):
    """Two cards; card 0 answers to two names (`0` and `uuid0`), as real specs name a card twice."""

    def __init__(self, fm: FakeMachine) -> None:
        card0 = replace(example_gpu(0), cdi_names=(f"{KIND}=0", f"{KIND}=uuid0"))
        super().__init__(gpus=[card0, example_gpu(1)])
        self.fm = fm

    @hookimpl
    def rdc_hardware_units(self, name: str, inventory: Mapping[str, Any]) -> list[str] | None:
        kind, _, device = name.partition("=")
        if kind != KIND:
            return None
        index = {"0": 0, "uuid0": 0, "1": 1}[device]
        return [f"pci:0000:0{index + 1}:00.0"]

    @hookimpl
    def rdc_cdi_specs(self, ctx: SetupContext) -> list[CdiSpecFile]:
        return [CdiSpecFile("example.yaml", spec=spec_document(self.fm, ["0", "1", "uuid0"]))]


@pytest.fixture
def machine_set_up(
    monkeypatch: pytest.MonkeyPatch, make_fake_machine: Callable[[str], FakeMachine]
) -> Iterator[tuple[FakeMachine, Any]]:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    fm = make_fake_machine("demo")
    plugins = load_plugins(extra=[("example", UnitsVendor(fm))])
    run_setup(fm.machine, plugins, {})
    yield fm, plugins


def test_walkthrough_grants_reserves_and_asks_the_gate(machine_set_up: tuple[FakeMachine, Any]) -> None:
    fm, plugins = machine_set_up

    steps = [(s.command, s.ok, s.outcome) for s in walkthrough(fm.machine, plugins)]

    assert steps[0][:2] == (f"rdc repo gpu grant alpha@demo --device {KIND}=0 --exclusive", True)
    assert steps[1][:2] == (f"rdc repo gpu grant beta@demo --device {KIND}=uuid0", False)
    assert "exclusively" in steps[1][2]  # the same card under another name
    assert steps[2][1] is False and f"did you mean {KIND}=0" in steps[2][2]  # a typo, with suggestions
    assert steps[3][:2] == (f"rdc repo gpu grant beta@demo --device {KIND}=1", True)
    assert steps[4][1] is True  # alpha's container with its granted card is admitted
    assert steps[5][1] is False and f"repo beta has no grant for {KIND}=0" in steps[5][2]
    assert steps[6][1] is False and "--gpus" in steps[6][2]
