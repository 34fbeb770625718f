"""Fixtures shared by the core suite's files."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from advice_kit import record
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


record()  # the advice of every error and refusal made in the session, read by test_advised_commands.py


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The advised commands are read last, once every other test has made its errors and refusals."""
    last = [item for item in items if item.path.name == "test_advised_commands.py"]
    items[:] = [item for item in items if item not in last] + last
