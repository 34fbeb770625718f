"""Shared fixtures: where the real captures live (inventory_of and gate_context come from rediacc_core)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

REALDATA = Path(os.environ.get("REDIACC_REALDATA", "../shared/realdata"))


@pytest.fixture
def realdata() -> Path:
    if not REALDATA.is_dir():
        pytest.skip(f"real captures not found at {REALDATA} (set REDIACC_REALDATA)")
    return REALDATA


@pytest.fixture
def capture(realdata: Path) -> Callable[[str], str]:
    """A real capture's text by its path under the realdata directory."""

    def read(relative: str) -> str:
        return (realdata / relative).read_text(encoding="utf-8")

    return read
