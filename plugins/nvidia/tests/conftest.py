"""Shared fixtures: where the real captures live (inventory_of and gate_context come from rediacc_core)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rediacc_core.testing import real_capture


@pytest.fixture
def realdata() -> Path:
    return real_capture()


@pytest.fixture
def capture(realdata: Path) -> Callable[[str], str]:
    """A real capture's text by its path under the realdata directory."""

    def read(relative: str) -> str:
        return (realdata / relative).read_text(encoding="utf-8")

    return read
