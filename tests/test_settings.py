"""Per-machine settings live on the machine, in `<root>/etc/rediacc/settings.json`, and are read live."""

from __future__ import annotations

import ast
import importlib
import json
import os
from collections import Counter
from pathlib import Path

import pytest

from rediacc_core.errors import EXIT_BUSY, EXIT_VALIDATION, BusyError, StateError, ValidationError
from rediacc_core.machine import Machine
from rediacc_core.setting import Setting, registry
from rediacc_core.settings import (
    SETTINGS,
    LiveSettings,
    change_settings,
    effective,
    read_settings,
    set_setting,
    unset_setting,
)
from rediacc_core.statelock import state_lock

LEGACY = "legacy-visible-devices"
OTHER_DEFAULTS = {
    "bind-roots": "",
    "extra-capabilities": "",
    "volume-drivers": "",
    "gate-workers": "1",
    "lease-end": "keep",
    "publish-addresses": "127.0.0.1",  # loopback only unless the operator widens it
    "publish-ports": "1024-65535",
    "publish-limit": "64",
    "pids-limit": "4096",
    "registries": "",
    "gpu-health": "refuse",  # a GPU its driver reported unhealthy is held back
    "dcgm-job-mapping-dir": "",
    "image-store": "overlay2",
    "net-path": "auto",  # the kernel path where the host forwards IPv4, else slirp4netns
}


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    root = tmp_path / "root"
    root.mkdir()
    return Machine("m1", root)


def test_the_settings_file_is_under_the_machine_root(machine: Machine) -> None:
    assert machine.settings_path == machine.root / "etc" / "rediacc" / "settings.json"


def test_without_a_file_no_setting_is_set_and_every_one_has_its_default(machine: Machine) -> None:
    assert read_settings(machine) == {}
    assert effective({}) == {LEGACY: "refuse", **OTHER_DEFAULTS}
    assert SETTINGS[LEGACY].choices == ("refuse", "translate")


def test_set_and_unset_are_written_to_the_file_and_read_back(machine: Machine) -> None:
    assert set_setting(machine, LEGACY, "translate") == {LEGACY: "translate"}

    assert read_settings(machine) == {LEGACY: "translate"}
    assert effective(read_settings(machine)) == {LEGACY: "translate", **OTHER_DEFAULTS}
    assert json.loads(machine.settings_path.read_text()) == {
        "schemaVersion": 1,
        "settings": {LEGACY: "translate"},
    }

    assert unset_setting(machine, LEGACY) == {}
    assert read_settings(machine) == {}
    assert json.loads(machine.settings_path.read_text()) == {"schemaVersion": 1, "settings": {}}


def test_unsetting_what_was_never_set_writes_nothing(machine: Machine) -> None:
    unset_setting(machine, LEGACY)

    assert not machine.settings_path.exists()


@pytest.mark.parametrize(
    ("key", "value", "what", "todo"),
    [
        (
            "colour",
            "blue",
            "unknown machine setting 'colour'",
            "use one of: bind-roots, dcgm-job-mapping-dir, extra-capabilities, gate-workers, "
            "gpu-health, image-store, lease-end, legacy-visible-devices, net-path, pids-limit, "
            "publish-addresses, publish-limit, publish-ports, registries, volume-drivers",
        ),
        (
            LEGACY,
            "sometimes",
            f"invalid value 'sometimes' for setting '{LEGACY}'",
            "use one of: refuse, translate",
        ),
    ],
)
def test_an_unknown_key_or_value_is_refused_with_exit_2_and_nothing_is_written(
    machine: Machine, key: str, value: str, what: str, todo: str
) -> None:
    set_setting(machine, LEGACY, "translate")
    before = machine.settings_path.read_bytes()

    with pytest.raises(ValidationError) as caught:
        set_setting(machine, key, value)

    assert caught.value.what == what and caught.value.todo == todo
    assert caught.value.exit_code == EXIT_VALIDATION
    assert machine.settings_path.read_bytes() == before


def test_unsetting_an_unknown_key_is_refused(machine: Machine) -> None:
    with pytest.raises(ValidationError, match="unknown machine setting 'colour'"):
        unset_setting(machine, "colour")


def test_several_changes_apply_all_or_none(machine: Machine) -> None:
    set_setting(machine, LEGACY, "translate")

    with pytest.raises(ValidationError):
        change_settings(machine, [(LEGACY, None), ("colour", "blue")])
    assert read_settings(machine) == {LEGACY: "translate"}

    assert change_settings(machine, [(LEGACY, None), (LEGACY, "refuse")]) == {LEGACY: "refuse"}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{broken", "is not valid JSON (line 1, column 2"),
        (b"[]", "does not match its schema"),
        (b'{"schemaVersion": 2, "settings": {}}', "does not match its schema"),
        (b'{"schemaVersion": 1, "settings": {"legacy-visible-devices": 1}}', "does not match its schema"),
        (b'{"schemaVersion": 1, "settings": {"colour": "blue"}}', "unknown machine setting 'colour'"),
        (b'{"schemaVersion": 1, "settings": {"legacy-visible-devices": "maybe"}}', "invalid value 'maybe'"),
        (b"\xff\xfe", "is not UTF-8 text"),
    ],
    ids=["json", "shape", "version", "type", "unknown-key", "bad-value", "utf8"],
)
def test_a_corrupt_file_is_an_error_naming_it_never_the_defaults(
    machine: Machine, content: bytes, problem: str
) -> None:
    machine.settings_path.parent.mkdir(parents=True)
    machine.settings_path.write_bytes(content)

    for read in (lambda: read_settings(machine), LiveSettings(machine).settings):
        with pytest.raises(ValidationError) as caught:
            read()
        assert str(machine.settings_path) in caught.value.what and problem in caught.value.what
        assert "restore" in caught.value.todo
    # A change would overwrite what cannot be read: refused, the file kept as it was.
    with pytest.raises(ValidationError):
        set_setting(machine, LEGACY, "translate")
    assert machine.settings_path.read_bytes() == content


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_an_unreadable_file_is_an_error_naming_it(machine: Machine) -> None:
    set_setting(machine, LEGACY, "translate")
    machine.settings_path.chmod(0)

    with pytest.raises(ValidationError, match=f"cannot read settings file {machine.settings_path}"):
        read_settings(machine)


def test_changes_wait_for_the_machine_state_lock(machine: Machine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOCK_TIMEOUT", "0")

    with state_lock(machine), pytest.raises(BusyError) as caught:
        set_setting(machine, LEGACY, "translate")

    assert caught.value.exit_code == EXIT_BUSY
    assert read_settings(machine) == {}


def test_a_change_to_a_machine_without_its_root_is_refused_and_creates_nothing(tmp_path: Path) -> None:
    gone = Machine("gone", tmp_path / "gone")

    assert read_settings(gone) == {}  # nothing there: the defaults
    with pytest.raises(StateError, match="is not a directory"):
        set_setting(gone, LEGACY, "translate")
    assert not gone.root.exists()


# --- live reading for the gate -------------------------------------------------------------------


def test_live_settings_are_re_read_only_when_the_file_changed(machine: Machine) -> None:
    live = LiveSettings(machine)
    assert live.settings() == {} and live.reads == 0  # no file: nothing to parse

    set_setting(machine, LEGACY, "translate")
    assert live.settings() == {LEGACY: "translate"}
    assert live.settings() == {LEGACY: "translate"}
    assert live.reads == 1

    set_setting(machine, LEGACY, "refuse")  # same size, written at once: still seen as a change
    assert live.settings() == {LEGACY: "refuse"} and live.reads == 2

    machine.settings_path.unlink()
    assert live.settings() == {} and live.reads == 2


def test_a_broken_file_stays_an_error_until_it_changes(machine: Machine) -> None:
    live = LiveSettings(machine)
    set_setting(machine, LEGACY, "translate")
    machine.settings_path.write_text("{broken")

    for _ in range(3):
        with pytest.raises(ValidationError, match="is not valid JSON"):
            live.settings()
    assert live.reads == 1

    machine.settings_path.unlink()
    set_setting(machine, LEGACY, "translate")
    assert live.settings() == {LEGACY: "translate"} and live.reads == 2


def test_live_settings_cannot_be_changed_by_whoever_reads_them(machine: Machine) -> None:
    set_setting(machine, LEGACY, "refuse")
    live = LiveSettings(machine)

    with pytest.raises(TypeError):
        live.settings()[LEGACY] = "translate"  # type: ignore[index]
    assert live.settings() == {LEGACY: "refuse"}


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("bind-roots", "/", "other than /"),
        ("bind-roots", "relative/dir", "absolute"),
        ("bind-roots", "/etc/rediacc", "no container may reach"),
        ("bind-roots", "/var", "overlaps /var/"),
        ("bind-roots", "/data/sets/../../dev", "normalised"),
        ("extra-capabilities", "SYS_ADMIN", "cannot be allowed"),
        ("extra-capabilities", "NET_ADMIN,SYS_PTRACE", "cannot be allowed"),
        ("volume-drivers", "bad driver!", "not a volume driver name"),
        ("gate-workers", "0", "from 1 to 16"),
        ("gate-workers", "17", "from 1 to 16"),
        ("gate-workers", "two", "use a whole number"),
        ("gate-workers", "\u0662", "use a whole number"),
        ("publish-addresses", "localhost", "not an IPv4 address"),
        ("publish-addresses", "::1", "no IPv6 uplink"),
        ("publish-ports", "0-100", "from 1 to 65535"),
        ("publish-ports", "2000-1024", "the low one first"),
        ("publish-ports", "1024-70000", "from 1 to 65535"),
        ("publish-ports", "1024:65535", "not a port range"),
        ("publish-ports", "\u0661-9", "not a port range"),
        ("publish-limit", "-1", "from 0 to 65535"),
        ("publish-limit", "65536", "from 0 to 65535"),
        ("publish-limit", "many", "from 0 to 65535"),
        ("pids-limit", "0", "from 1 to 4194304"),
        ("pids-limit", "-1", "from 1 to 4194304"),  # unlimited is what the setting exists to prevent
        ("pids-limit", "4194305", "from 1 to 4194304"),
        ("pids-limit", "\u0664", "from 1 to 4194304"),
        ("registries", "localhost:99999", "is not host or host:port"),
        ("registries", "http://localhost:5000", "is not host or host:port"),
        ("registries", "[::1", "is not host or host:port"),
        ("registries", "user@localhost", "is not host or host:port"),
    ],
)
def test_list_settings_are_checked_before_anything_is_written(
    machine: Machine, key: str, value: str, says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        set_setting(machine, key, value)
    assert not machine.settings_path.exists()


def test_list_settings_are_kept_as_given(machine: Machine) -> None:
    set_setting(machine, "bind-roots", "/data/sets:ro,/srv/shared")
    set_setting(machine, "extra-capabilities", "NET_ADMIN")
    assert read_settings(machine)["bind-roots"] == "/data/sets:ro,/srv/shared"


# --- the registry: each room declares its own settings, `SETTINGS` lists them ------------------

CORE = Path(__file__).resolve().parent.parent / "rediacc_core"


def declarations_in(source: str) -> list[tuple[str, str]]:
    """Each `NAME = Setting("name", …)` at the top of a module's `source`: (NAME, name)."""
    found = []
    for node in ast.parse(source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if (
            isinstance(target, ast.Name)
            and isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "Setting"
            and value.args
            and isinstance(value.args[0], ast.Constant)
        ):
            found.append((target.id, str(value.args[0].value)))
    return found


def declarations() -> list[tuple[str, str, str]]:
    """Every setting a module of the core declares: (module, NAME, name)."""
    found = []
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found += [(module, attr, name) for attr, name in declarations_in(path.read_text())]
    return found


def test_the_walk_finds_a_declaration_at_the_top_of_a_module() -> None:
    source = 'X = Setting("x", (), "", "help")\nY: Setting = Setting("y", ("a",), "a", "h")\n'
    source += 'def f() -> None:\n    Z = Setting("z", (), "", "inside a function: no declaration")\n'
    assert declarations_in(source) == [("X", "x"), ("Y", "y")]


def test_every_setting_a_room_declares_is_in_the_registry() -> None:
    found = declarations()
    assert len(found) >= len(SETTINGS) > 0
    for module, attr, name in found:
        declared = getattr(importlib.import_module(module), attr)
        assert SETTINGS.get(name) is declared, (
            f"{module}.{attr} declares the setting {name!r}, which rediacc_core.settings.SETTINGS "
            "does not list: add it there, where `rdc machine config` should list it"
        )
    assert sorted(name for _, _, name in found) == sorted(SETTINGS)


def test_no_setting_name_is_declared_twice() -> None:
    names = Counter(name for _, _, name in declarations())
    assert [name for name, count in names.items() if count > 1] == []


def test_the_registry_refuses_a_name_registered_twice() -> None:
    first = Setting("lease-end", ("keep", "stop"), "keep", "one room's")
    again = Setting("lease-end", ("stop",), "stop", "another room's")
    with pytest.raises(ValueError, match="machine setting 'lease-end' is declared twice"):
        registry(first, again)
    assert list(registry(first)) == ["lease-end"]


def test_the_registry_is_read_only_and_keeps_the_listed_order() -> None:
    assert list(SETTINGS) == [
        "legacy-visible-devices", "bind-roots", "extra-capabilities", "volume-drivers", "lease-end",
        "publish-addresses", "publish-ports", "publish-limit", "pids-limit", "registries",
        "image-store", "gate-workers", "net-path", "gpu-health", "dcgm-job-mapping-dir",
    ]  # fmt: skip
    with pytest.raises(TypeError):
        SETTINGS["lease-end"] = SETTINGS["gpu-health"]  # type: ignore[index]
