"""Shared fixtures: where the real captures live (inventory_of and gate_context come from rediacc_core)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from rediacc_nvidia import testing

from rediacc_core.plugins import Plugins
from rediacc_core.setup import run_setup
from rediacc_core.testing import FakeMachine, real_capture

MIG_A100 = "nvidia-smi-q-x/a100-sxm4-40gb-mig_510.47.03.xml"  # a real capture, MIG mode on


@pytest.fixture
def realdata() -> Path:
    return real_capture()


@pytest.fixture
def capture(realdata: Path) -> Callable[[str], str]:
    """A real capture's text by its path under the realdata directory."""

    def read(relative: str) -> str:
        return (realdata / relative).read_text(encoding="utf-8")

    return read


@pytest.fixture
def set_up_mig_a100(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> Callable[[Plugins], FakeMachine]:
    """A machine with the real A100 capture split into two 3g.20gb MIG devices, set up by
    `rdc machine setup` with the plugins given."""

    def set_up(plugins: Plugins) -> FakeMachine:
        fm = make_fake_machine("a100")
        testing.nvidia_machine(
            fm, capture(MIG_A100), compute_caps=["8.0"], mig_profiles={0: ["3g.20gb", "3g.20gb"]}
        )
        run_setup(fm.machine, plugins, {"install_nvidia_toolkit": "auto"})
        return fm

    return set_up
