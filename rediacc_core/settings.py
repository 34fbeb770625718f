"""Per-machine settings: the registry of those the core knows, and the file on the machine that holds them.

Settings live on the machine, like its grants, in `<root>/etc/rediacc/settings.json` (checked against
`schema/settings.schema.json` and the registry below on every read), so a repo gate reads the same
settings whoever started it and picks a change up at its next request. Only settings set on the
machine are stored; a missing file means every setting has its default.

Every default is the safe choice: a gate that cannot read the file decides with the defaults, which
is failing closed.

Each room declares the settings it acts on (`rediacc_core.setting`: name, values, default, help),
and `SETTINGS` collects them by an explicit list, here, on the floor of the file's reader. Every
process that reads the file sees every setting, whatever else it imported (a name the registry does
not hold is an error in the file), and imports still go only downward: the declaring modules read
no settings file, so a room that does (the running parts, telemetry) declares in a module of its
own beside it. A room that declares a setting adds it to the list; `tests/test_settings.py` fails
on one declared and not listed. (Rooms adding themselves when imported, as tox's plugins add
their keys, would leave a process that never imported a room, a repo gate say, refusing a file that
holds that room's setting.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rediacc_core import health, publishing
from rediacc_core.errors import StateError, ValidationError
from rediacc_core.files import (
    LiveFile,
    StatKey,
    parse_json_checked,
    read_text_keyed,
    replace_watched_json,
    restore_hint,
)
from rediacc_core.gate.policy import settings as policy
from rediacc_core.machine import Machine
from rediacc_core.runtime import settings as running
from rediacc_core.setting import Setting, registry
from rediacc_core.statelock import state_lock
from rediacc_core.telemetry_settings import DCGM_JOB_MAPPING_DIR

SCHEMA = "settings.schema.json"
SCHEMA_VERSION = 1
WHAT = "settings file"

# Every machine setting, in the order `rdc machine config` lists them.
SETTINGS: Mapping[str, Setting] = registry(
    policy.LEGACY_VISIBLE_DEVICES,
    policy.BIND_ROOTS,
    policy.EXTRA_CAPABILITIES,
    policy.VOLUME_DRIVERS,
    running.LEASE_END,
    publishing.PUBLISH_ADDRESSES,
    publishing.PUBLISH_PORTS,
    publishing.PUBLISH_LIMIT,
    policy.PIDS_LIMIT,
    policy.REGISTRIES,
    running.IMAGE_STORE,
    running.GATE_WORKERS,
    running.NET_PATH,
    health.GPU_HEALTH,
    DCGM_JOB_MAPPING_DIR,
)


def check_key(key: str) -> Setting:
    setting = SETTINGS.get(key)
    if setting is None:
        raise ValidationError(
            f"unknown machine setting {key!r}", "use one of: " + ", ".join(sorted(SETTINGS))
        )
    return setting


def check_setting(key: str, value: str) -> None:
    setting = check_key(key)
    if setting.check is not None:
        why = setting.check(value)
        if why:
            raise ValidationError(f"invalid value {value!r} for setting {key!r}: {why}", "fix the value")
        return
    if value not in setting.choices:
        raise ValidationError(
            f"invalid value {value!r} for setting {key!r}", f"use one of: {', '.join(setting.choices)}"
        )


def parse_settings(text: str, path: Path) -> dict[str, str]:
    """The settings in a settings file's text; any problem is a ValidationError naming the file."""
    document = parse_json_checked(text, path, SCHEMA, WHAT)
    settings: dict[str, str] = dict(document["settings"])
    for key, value in settings.items():
        try:
            check_setting(key, value)
        except ValidationError as exc:
            raise ValidationError(f"{WHAT} {path}: {exc.what}", restore_hint(path)) from exc
    return settings


def _read_file(path: Path) -> tuple[StatKey, dict[str, str]] | None:
    found = read_text_keyed(path, WHAT)
    return None if found is None else (found[0], parse_settings(found[1], path))


def read_settings(machine: Machine) -> dict[str, str]:
    """The settings set on the machine ({} when none is: every setting has its default)."""
    found = _read_file(machine.settings_path)
    return {} if found is None else found[1]


def effective(settings: Mapping[str, str]) -> dict[str, str]:
    """Every known setting's value: the one set on the machine, else the default."""
    return {name: settings.get(name, s.default) for name, s in SETTINGS.items()}


def change_settings(machine: Machine, changes: Sequence[tuple[str, str | None]]) -> dict[str, str]:
    """Apply `changes` in order, all or none: (key, value) sets, (key, None) gives back the default.

    Every change is checked before the file is touched, under the machine's state lock. Returns the
    machine's settings afterwards.
    """
    for key, value in changes:
        if value is None:
            check_key(key)
        else:
            check_setting(key, value)
    if not machine.root.is_dir():
        # Never create a machine's root as a side effect of a setting.
        raise StateError(
            f"the root of machine {machine.name!r}, {machine.root}, is not a directory",
            f"create it (mkdir -p {machine.root}) or forget the machine: rdc machine remove {machine.name}",
        )
    with state_lock(machine):
        before = read_settings(machine)  # a corrupt file stops here: nothing is overwritten
        after = dict(before)
        for key, value in changes:
            if value is None:
                after.pop(key, None)
            else:
                after[key] = value
        if after != before:
            document: dict[str, Any] = {
                "schemaVersion": SCHEMA_VERSION,
                "settings": dict(sorted(after.items())),
            }
            replace_watched_json(machine.settings_path, document)  # LiveSettings must see every write
    return after


def set_setting(machine: Machine, key: str, value: str) -> dict[str, str]:
    """Set `key` on the machine (checked first); returns the machine's settings after the change."""
    return change_settings(machine, [(key, value)])


def unset_setting(machine: Machine, key: str) -> dict[str, str]:
    """Give `key` back its default on the machine; returns the machine's settings after the change."""
    return change_settings(machine, [(key, None)])


class LiveSettings:
    """The machine's settings as the gate sees them, re-read only when the file changed.

    One `stat` per call when unchanged. A missing file is {} (the defaults); an unreadable or
    corrupt one raises a ValidationError naming the file, for the caller to decide what is safe.
    """

    def __init__(self, machine: Machine) -> None:
        path = machine.settings_path

        def load() -> tuple[StatKey, Mapping[str, str]] | None:
            found = _read_file(path)
            # Read-only: every decision shares this one mapping with the plugins' rules.
            return None if found is None else (found[0], MappingProxyType(found[1]))

        self._file: LiveFile[Mapping[str, str]] = LiveFile(path, load, MappingProxyType({}), WHAT)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def reads(self) -> int:
        """How many times the file was parsed (tests check it is not re-read needlessly)."""
        return self._file.reads

    def settings(self) -> Mapping[str, str]:
        return self._file.get()
