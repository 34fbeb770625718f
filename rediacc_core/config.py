"""The `rdc` config file: which machines exist, where their roots are, and their settings.

`$REDIACC_CONFIG` names the file, else `~/.config/rediacc/config.yaml`. Its shape:

    machines:
      lab:
        root: /srv/sim/lab
        settings: {legacy-visible-devices: translate}

`localhost` (root `/`) always exists; it may carry settings but can be neither added nor removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rediacc_core.errors import NotFoundError, StateError, ValidationError
from rediacc_core.files import atomic_write_text
from rediacc_core.machine import Machine

CONFIG_ENV = "REDIACC_CONFIG"
LOCALHOST = "localhost"

# Machine names end up in repo references (`name:tag@machine`), so `@` and `:` stay out of them.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class Setting:
    """A per-machine setting the core knows, with the values it accepts."""

    name: str
    choices: tuple[str, ...]
    default: str
    help: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting(
            "legacy-visible-devices",
            ("refuse", "translate"),
            "refuse",
            "a container request that selects GPUs through a vendor's visible-devices variable: refuse it, "
            "naming the CDI devices to use, or translate it into those CDI devices when all are granted",
        ),
    ]
}


def default_path() -> Path:
    env = os.environ.get(CONFIG_ENV)
    if env:
        return Path(env)
    return Path.home() / ".config" / "rediacc" / "config.yaml"


def check_machine_name(name: str) -> None:
    if not _NAME.match(name):
        raise ValidationError(
            f"invalid machine name {name!r}: use letters, digits, '.', '_' and '-' (up to 63), "
            "starting with a letter or digit",
            "choose a name such as `lab-1`",
        )


def check_setting(key: str, value: str) -> None:
    setting = SETTINGS.get(key)
    if setting is None:
        raise ValidationError(
            f"unknown machine setting {key!r}",
            "use one of: " + ", ".join(sorted(SETTINGS)),
        )
    if value not in setting.choices:
        raise ValidationError(
            f"invalid value {value!r} for setting {key!r}",
            f"use one of: {', '.join(setting.choices)}",
        )


@dataclass
class Config:
    """The parsed config file. Changes stay in memory until `save()`."""

    path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None = None) -> Config:
        path = path if path is not None else default_path()
        if not path.exists():
            return cls(path)
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValidationError(
                f"cannot read config file {path}: {exc.strerror}", f"check the permissions of {path}"
            ) from exc
        except yaml.YAMLError as exc:
            raise ValidationError(
                f"config file {path} is not valid YAML: {exc}", f"fix {path} by hand; nothing was changed"
            ) from exc
        return cls(path, _parse(path, document))

    # --- reading ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        return [LOCALHOST, *sorted(name for name in self.entries if name != LOCALHOST)]

    def machines(self) -> list[Machine]:
        return [self.machine(name) for name in self.names()]

    def machine(self, name: str) -> Machine:
        if name == LOCALHOST:
            local = self.entries.get(LOCALHOST, {})
            return Machine(LOCALHOST, Path("/"), dict(local.get("settings", {})))
        entry = self.entries.get(name)
        if entry is None:
            raise NotFoundError(
                f"no machine named {name!r}",
                "run `rdc machine list` to see the machines, or `rdc machine add`",
            )
        return Machine(name, Path(entry["root"]), dict(entry.get("settings", {})))

    def has(self, name: str) -> bool:
        return name == LOCALHOST or name in self.entries

    # --- changing ---------------------------------------------------------------------------
    def add(self, name: str, root: Path, settings: Mapping[str, str] | None = None) -> Machine:
        check_machine_name(name)
        if self.has(name):
            raise StateError(
                f"a machine named {name!r} already exists",
                f"choose another name, or remove it first with `rdc machine remove {name}`",
            )
        if not root.is_absolute():
            root = root.absolute()
        if not root.is_dir():
            raise ValidationError(
                f"machine root {root} is not a directory", f"create it first: mkdir -p {root}"
            )
        for key, value in (settings or {}).items():
            check_setting(key, value)
        entry: dict[str, Any] = {"root": str(root)}
        if settings:
            entry["settings"] = dict(settings)
        self.entries[name] = entry
        return self.machine(name)

    def remove(self, name: str) -> None:
        if name == LOCALHOST:
            raise ValidationError("localhost always exists and cannot be removed", "remove another machine")
        if name not in self.entries:
            self.machine(name)  # raises the not-found error
        del self.entries[name]

    def set_setting(self, name: str, key: str, value: str) -> None:
        self.machine(name)  # not found -> error before anything changes
        check_setting(key, value)
        entry = self.entries.setdefault(name, {})
        entry.setdefault("settings", {})[key] = value

    def unset_setting(self, name: str, key: str) -> None:
        self.machine(name)
        if key not in SETTINGS:
            raise ValidationError(
                f"unknown machine setting {key!r}", "use one of: " + ", ".join(sorted(SETTINGS))
            )
        settings = self.entries.get(name, {}).get("settings", {})
        settings.pop(key, None)

    def save(self) -> None:
        machines: dict[str, Any] = {}
        for name in sorted(self.entries):
            entry = {k: v for k, v in self.entries[name].items() if k != "settings" or v}
            if entry:
                machines[name] = entry
        text = yaml.safe_dump({"machines": machines}, sort_keys=False, default_flow_style=False)
        atomic_write_text(self.path, text, mode=0o600)


def _parse(path: Path, document: Any) -> dict[str, dict[str, Any]]:
    """Check the file's shape strictly: a typo here would silently point a machine somewhere else."""

    def bad(problem: str) -> ValidationError:
        return ValidationError(f"config file {path}: {problem}", f"fix {path} by hand; nothing was changed")

    if document is None:
        return {}
    if not isinstance(document, dict):
        raise bad("the top level must be a mapping with a `machines` key")
    unknown = set(document) - {"machines"}
    if unknown:
        raise bad(f"unknown top-level keys: {', '.join(sorted(map(str, unknown)))}")
    machines = document.get("machines") or {}
    if not isinstance(machines, dict):
        raise bad("`machines` must be a mapping of machine name to {root, settings}")
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in machines.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad(f"invalid machine name {name!r}")
        if not isinstance(entry, dict):
            raise bad(f"machine {name!r} must be a mapping with `root`")
        extra = set(entry) - {"root", "settings"}
        if extra:
            raise bad(f"machine {name!r} has unknown keys: {', '.join(sorted(map(str, extra)))}")
        root = entry.get("root")
        if name == LOCALHOST:
            if root not in (None, "/"):
                raise bad("localhost's root is always /")
        elif not isinstance(root, str) or not root.startswith("/"):
            raise bad(f"machine {name!r} needs an absolute `root` path")
        settings = entry.get("settings") or {}
        if not isinstance(settings, dict):
            raise bad(f"machine {name!r}: `settings` must be a mapping")
        for key, value in settings.items():
            try:
                check_setting(str(key), str(value))
            except ValidationError as exc:
                raise bad(f"machine {name!r}: {exc.what}") from exc
        parsed: dict[str, Any] = {"settings": {str(k): str(v) for k, v in settings.items()}}
        if name != LOCALHOST:
            parsed["root"] = root
        entries[name] = parsed
    return entries
