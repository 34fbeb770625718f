"""Fixtures shared by the core suite's files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from setup_kit import FakeVendor, use_vendor

from rediacc_core.plugins import set_plugins


@pytest.fixture
def vendor(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeVendor]:
    """A fake vendor plugin, the only plugin the CLI sees for the test."""
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    plugin = FakeVendor()
    use_vendor(plugin)
    yield plugin
    set_plugins(None)
