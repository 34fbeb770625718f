"""Per-machine settings: the table of those the core knows, and the file on the machine that holds them.

Settings live on the machine, like its grants, in `<root>/etc/rediacc/settings.json` (checked against
`schema/settings.schema.json` and the table below on every read), so a repo gate reads the same
settings whoever started it and picks a change up at its next request. Only settings set on the
machine are stored; a missing file means every setting has its default.

Every default is the safe choice: a gate that cannot read the file decides with the defaults, which
is failing closed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rediacc_core.errors import StateError, ValidationError
from rediacc_core.files import (
    LiveFile,
    StatKey,
    parse_json_checked,
    read_text_keyed,
    replace_watched_json,
    restore_hint,
)
from rediacc_core.machine import Machine
from rediacc_core.publishing import (
    DEFAULT_LIMIT,
    DEFAULT_RANGE,
    MAX_LIMIT,
    check_limit_setting,
    check_range_setting,
)
from rediacc_core.statelock import state_lock
from rediacc_core.values import split_list

SCHEMA = "settings.schema.json"
SCHEMA_VERSION = 1
WHAT = "settings file"


@dataclass(frozen=True)
class Setting:
    """A per-machine setting the core knows, with the values it accepts.

    A setting has either `choices`, or a `check` that returns why a value is wrong (None when it is
    right) for free-form values such as comma-separated lists.
    """

    name: str
    choices: tuple[str, ...]
    default: str
    help: str
    check: Callable[[str], str | None] | None = None
    form: str = ""  # the shape of a free-form value, as `machine config` shows it (`1-16`, `DIR[:ro],…`)

    @property
    def values(self) -> str:
        """What the setting accepts, in a few characters: its choices, or the shape of its value."""
        return "|".join(self.choices) if self.choices else self.form


def _check_bind_roots(value: str) -> str | None:
    from rediacc_core.gate.policy.mounts import check_root_setting

    for item in split_list(value):
        path = item.removesuffix(":ro")
        why = check_root_setting(path)
        if why:
            return f"bind root {item!r}: {why}"
    return None


def _check_capabilities(value: str) -> str | None:
    from rediacc_core.gate.policy.isolation import GRANTABLE_CAPABILITIES, capability_name

    for item in split_list(value):
        if capability_name(item) not in GRANTABLE_CAPABILITIES:
            return (
                f"capability {item!r} cannot be allowed (it reaches the host, or is unknown); "
                f"allowable: {', '.join(sorted(GRANTABLE_CAPABILITIES))}"
            )
    return None


# Each gate worker (`runtime.workers`) holds 1/N of the gate's buffer budget (64 MiB), and that share
# must still fit the largest body the gate reads and decides (4 MiB): so 16 at most. More event loops
# would not help either: they all wait on the one daemon.
MAX_WORKERS = 16


def check_worker_setting(value: str) -> str | None:
    """Why `value` is no valid `gate-workers` setting, or None."""
    if value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_WORKERS:
        return None
    return f"use a whole number from 1 to {MAX_WORKERS}"


def _check_addresses(value: str) -> str | None:
    import ipaddress

    for item in split_list(value):
        if item == "none":
            continue
        try:
            if ipaddress.ip_address(item).version != 4:
                return f"{item!r}: published ports have no IPv6 uplink; give IPv4 addresses"
        except ValueError:
            return f"{item!r} is not an IPv4 address of this host (or 'none')"
    return None


def _check_names(value: str) -> str | None:
    for item in split_list(value):
        if not all(c.isalnum() or c in "-_./:" for c in item):
            return f"{item!r} is not a volume driver name"
    return None


def _check_pids(value: str) -> str | None:
    from rediacc_core.gate.policy.limits import check_pids_setting

    return check_pids_setting(value)


def _check_registries(value: str) -> str | None:
    from rediacc_core.gate.policy.fetches import check_allowed_setting

    return check_allowed_setting(value)


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
        Setting(
            "bind-roots",
            (),
            "",
            "host directories containers may bind besides the repo's own files directory, comma-separated; "
            "':ro' after one forces read-only binds (/data/datasets:ro,/srv/shared)",
            _check_bind_roots,
            form="DIR[:ro],…",
        ),
        Setting(
            "extra-capabilities",
            (),
            "",
            "capabilities beyond Docker's default set that containers may add, comma-separated (NET_ADMIN)",
            _check_capabilities,
            form="CAPABILITY,…",
        ),
        Setting(
            "volume-drivers",
            (),
            "",
            "volume drivers besides 'local' that repos may use, comma-separated",
            _check_names,
            form="DRIVER,…",
        ),
        Setting(
            "lease-end",
            ("keep", "stop"),
            "keep",
            "a running container whose grant ended (a lease's end, a revoke without --stop): keep it "
            "running until it stops (it cannot start again), or have the repo's gate stop it within 30 s",
        ),
        Setting(
            "publish-addresses",
            (),
            "127.0.0.1",
            "host addresses a repo container's published port (-p 8080:80) listens on, through the repo's "
            "uplink, comma-separated IPv4 (0.0.0.0 = every address; none = publish nowhere)",
            _check_addresses,
            form="IPv4,…|none",
        ),
        Setting(
            "publish-ports",
            (),
            DEFAULT_RANGE,
            "the host ports a repo container may publish on (-p 8080:80), LOW-HIGH: a port outside is "
            "refused at create and never forwarded (below 1024 are the host's own services' ports)",
            check_range_setting,
            form="LOW-HIGH",
        ),
        Setting(
            "publish-limit",
            (),
            str(DEFAULT_LIMIT),
            f"the most host ports one repo publishes at once (0 to {MAX_LIMIT}): a create or start "
            "that would pass it is refused, and the port keeper forwards no more",
            check_limit_setting,
            form=f"0-{MAX_LIMIT}",
        ),
        Setting(
            "pids-limit",
            (),
            "4096",
            "the most processes a container may have (1 to 4194304): written into every container that "
            "asks for no limit or for unlimited, and a request for more refused, so that no container "
            "can use up the host's process ids",
            _check_pids,
            form="1-4194304",
        ),
        Setting(
            "registries",
            (),
            "",
            "loopback or link-local registries and servers the daemon may fetch from for a repo (pulls, "
            "pushes, logins, build remotes, imports), comma-separated host or host:port "
            "(localhost:5000,[::1]:5000); a host without a port allows each of its ports",
            _check_registries,
            form="HOST[:PORT],…",
        ),
        Setting(
            "image-store",
            ("overlay2", "containerd"),
            "overlay2",
            "where each repo's daemon keeps images and container layers: Docker's overlay2 driver, or the "
            "containerd image store (containerd snapshotter, the default of fresh Engine 29 installs) in "
            "the repo's own containerd; taken at the repo's next up, and a repo sees only the images of "
            "the store it runs with",
        ),
        Setting(
            "gate-workers",
            (),
            "1",
            "processes each repo's gate serves from (1 to 16): more let a repo's API calls use more CPUs "
            "where CPUs sit idle, each costs its own memory; taken at the gate's next start",
            check_worker_setting,
            form="1-16",
        ),
    ]
}


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
