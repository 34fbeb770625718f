"""`rdc plugins`: what loaded, from which distribution, which hooks, and what failed to load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import metadata

import pluggy
import pytest
import yaml
from click.testing import CliRunner, Result
from setup_kit import FakeVendor, use_vendor

from rediacc_core.cli import cli
from rediacc_core.plugins import PluginInfo, Plugins, load_plugins, set_plugins

VENDOR_DISTRIBUTIONS = {"nvidia": "rediacc-nvidia", "dri": "rediacc-dri", "amd": "rediacc-amd"}


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


@pytest.fixture(autouse=True)
def fresh_plugins() -> Iterator[None]:
    set_plugins(None)
    yield
    set_plugins(None)


def installed_vendors() -> dict[str, str]:
    found = {}
    for name, dist in VENDOR_DISTRIBUTIONS.items():
        try:
            metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
    return found


def test_json_lists_every_installed_vendor_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIACC_LOAD_PLUGINS", raising=False)
    vendors = installed_vendors()
    if not vendors:
        pytest.skip("no vendor plugin is installed in this environment (tox env `core`)")
    # Loaded fresh, not from the process-wide cache another test may have filled.
    set_plugins(load_plugins())

    result = rdc("plugins", "-o", "json")

    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    for name, dist in vendors.items():
        row = rows[name]
        assert row["distribution"] == dist
        assert row["version"] == metadata.version(dist)
        assert row["error"] is None and row["loaded"] is True
        assert all(hook.startswith("rdc_") for hook in row["hooks"])


def test_a_plugin_shows_the_hooks_it_implements(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    use_vendor(FakeVendor())

    rows = json.loads(rdc("plugins", "-o", "json").stdout)

    assert rows == [
        {
            "name": "fakevendor",
            "distribution": None,
            "version": None,
            "hooks": ["rdc_cdi_specs", "rdc_discover", "rdc_setup_options", "rdc_setup_steps"],
            "error": None,
            "loaded": True,
        }
    ]
    assert yaml.safe_load(rdc("plugins", "-o", "yaml").stdout) == rows


def test_the_table_shows_load_errors() -> None:
    set_plugins(
        Plugins(
            pluggy.PluginManager("rediacc"),
            [
                PluginInfo("good", "rediacc-good", "1.0", ("rdc_discover",)),
                PluginInfo("broken", "rediacc-broken", "0.3", error="ImportError: No module named 'x'"),
            ],
        )
    )

    lines = rdc("plugins").stdout.splitlines()

    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "HOOKS", "STATUS"]
    assert lines[1].split() == ["good", "rediacc-good", "1.0", "rdc_discover", "loaded"]
    assert lines[2].split()[:4] == ["broken", "rediacc-broken", "0.3", "-"]
    assert lines[2].endswith("failed: ImportError: No module named 'x'")


def test_no_plugins_at_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    set_plugins(load_plugins())

    assert rdc("plugins").stdout == "No plugins loaded.\n"
    assert rdc("plugins", "-o", "json").stdout == "[]\n"
