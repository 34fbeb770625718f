"""Plugins come only from the `rediacc` entry-point group, and a bad one never breaks `rdc`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from packages_kit import env_with, install

from rediacc_core import Gpu, hookimpl
from rediacc_core.machine import Machine
from rediacc_core.plugins import PluginLoadWarning, load_plugins


class Vendor:
    @hookimpl
    def rdc_discover(self, machine: Machine) -> list[Gpu]:
        return [Gpu(vendor="example", source="example", name="Example GPU", index=0)]


class Typo:
    @hookimpl
    def rdc_discovr(self, machine: Machine) -> list[Gpu]:
        return []


def test_empty_load_list_loads_no_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    assert load_plugins().infos == []


def test_load_list_limits_plugins_by_entry_point_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "no-such-plugin")
    assert load_plugins().names() == []


def test_extra_plugin_answers_through_the_typed_facade(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    plugins = load_plugins(extra=[("example", Vendor())])
    gpus = plugins.discover(Machine("m", tmp_path))  # rdc_discover
    assert [g.name for g in gpus] == ["Example GPU"]
    assert plugins.infos[0].hooks == ("rdc_discover",)


def test_unknown_hook_marks_the_plugin_broken_and_keeps_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    with pytest.warns(PluginLoadWarning, match="rdc_discovr"):
        plugins = load_plugins(extra=[("typo", Typo()), ("example", Vendor())])
    assert plugins.names() == ["example"]
    broken = [i for i in plugins.infos if i.error]
    assert broken[0].name == "typo" and "unknown hook 'rdc_discovr'" in (broken[0].error or "")


def _rdc_plugins_json(site: Path) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "rediacc_core.cli", "plugins", "-o", "json"],
        env=env_with(site),
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    listed: list[dict[str, object]] = json.loads(out.stdout)
    return listed


@pytest.mark.slow
def test_a_third_party_plugin_installed_later_is_listed(tmp_path: Path) -> None:
    install("example_vendor", tmp_path / "site")
    listed = {p["name"]: p for p in _rdc_plugins_json(tmp_path / "site")}
    assert listed["example"]["distribution"] == "rediacc-example-vendor"
    assert "rdc_hardware_units" in listed["example"]["hooks"]  # type: ignore[operator]


@pytest.mark.slow
def test_a_plugin_that_fails_to_import_is_reported_not_fatal(tmp_path: Path) -> None:
    install("broken_vendor", tmp_path / "site")
    listed = {p["name"]: p for p in _rdc_plugins_json(tmp_path / "site")}
    assert "libexample.so.1" in str(listed["broken"]["error"])


def test_raw_device_paths_skip_cdi_names_and_read_create_and_update() -> None:
    from rediacc_core import ApiRequest

    create = ApiRequest(
        "POST",
        "/containers/create",
        {},
        {"HostConfig": {"Devices": [{"PathOnHost": "/dev/card9"}, {"PathOnHost": "vendor.example/gpu=0"}]}},
    )
    update = ApiRequest("POST", "/containers/abc/update", {}, {"Devices": [{"PathOnHost": "/dev/x"}]})
    assert create.raw_device_paths() == ["/dev/card9"]
    assert update.is_container_update and update.raw_device_paths() == ["/dev/x"]
    assert (
        ApiRequest("POST", "/volumes/create", {}, {"Devices": [{"PathOnHost": "/dev/x"}]}).raw_device_paths()
        == []
    )
