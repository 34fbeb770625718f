"""The render-node part of `rdc demo`: a laptop-style integrated GPU."""

from __future__ import annotations

from rediacc_core.testing import FakeMachine
from rediacc_dri.testing import intel_igpu


def demo_layout(fm: FakeMachine) -> None:
    """An integrated GPU at 0000:00:02.0 with card0 and renderD128."""
    intel_igpu(fm)
