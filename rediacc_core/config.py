"""The `rdc` config file: which machines exist and where their roots are.

`$REDIACC_CONFIG` names the file, else `~/.config/rediacc/config.yaml`. Its shape:

    machines:
      lab:
        root: /srv/sim/lab
      gpu1:                     # reached over SSH (rediacc_core.remote)
        ssh: root@gpu1.example.com:2222
        identity: ~/.ssh/id_gpu1   # optional
        root: /                 # the root on the machine; optional, `/` by default

`localhost` (root `/`) always exists and can be neither added nor removed.

Per-machine settings live on the machine (`rediacc_core.settings`), never here: a repo gate started
by systemd or for another user must read the same ones. Files written before that may still hold
`settings:` under a machine; they are kept as they are (nothing recorded is lost) but have no
effect, and `old_settings` lets the CLI tell the operator how to move them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rediacc_core.errors import NotFoundError, StateError, ValidationError
from rediacc_core.files import atomic_write_text, stat_key
from rediacc_core.machine import Machine
from rediacc_core.remote.address import SshAddress

CONFIG_ENV = "REDIACC_CONFIG"
LOCALHOST = "localhost"

# Machine names end up in repo references (`name:tag@machine`), so `@` and `:` stay out of them.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


# Set by the machine-side agent: the one machine it serves, with its root on this host.
_pinned: tuple[str, str] | None = None


def pin_machine(name: str, root: str) -> None:
    """Make every `Config.load()` in this process see only `name`, a local machine at `root`.

    `rdc-agent` runs a forwarded command with this, so the command finds the machine under the name
    the client used without any config file on the machine.
    """
    global _pinned
    _pinned = (name, root)


def serving_client() -> bool:
    """Whether this process runs a command for a client elsewhere (`pin_machine` was called): what
    it prints about local paths (a socket to export) means nothing there, the client says it."""
    return _pinned is not None


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


def parsed_copy(path: Path) -> Path:
    """Where the config file's parsed document is kept, as JSON, beside it."""
    return path.with_name(f".{path.name}.parsed.json")


def _read_document(path: Path) -> Any:
    """The config file's YAML document, parsed once per version of the file.

    Every `rdc` command reads the config, and importing a YAML parser costs a read command more than
    a tenth of its time: the parsed document is kept beside the file as JSON with the file's StatKey,
    and used while the file's key is unchanged (an edit or a save replaces the key)."""
    with path.open("rb") as handle:
        key = list(stat_key(os.fstat(handle.fileno())))
        raw = handle.read()
    copy = parsed_copy(path)
    with contextlib.suppress(OSError, ValueError), copy.open("rb") as kept_file:
        # Anyone can read a file's StatKey: only a copy this user wrote, which no one else may
        # change, is trusted (a config in a shared directory such as /tmp is then parsed each time).
        st = os.fstat(kept_file.fileno())
        if st.st_uid == os.geteuid() and not st.st_mode & 0o022:
            kept = json.loads(kept_file.read().decode("utf-8"))
            if isinstance(kept, dict) and kept.get("key") == key:
                return kept.get("document")
    import yaml

    try:
        document = yaml.safe_load(raw.decode("utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValidationError(
            f"config file {path} is not valid YAML: {exc}", f"fix {path} by hand; nothing was changed"
        ) from exc
    with contextlib.suppress(OSError, TypeError, ValueError):  # not JSON-able, read-only: parse next time
        atomic_write_text(copy, json.dumps({"key": key, "document": document}), mode=0o600)
    return document


@dataclass
class Config:
    """The parsed config file. Changes stay in memory until `save()`."""

    path: Path
    entries: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path | None = None) -> Config:
        if _pinned is not None and path is None:
            name, root = _pinned
            return cls(Path(os.devnull), {} if name == LOCALHOST else {name: {"root": root}})
        path = path if path is not None else default_path()
        if not path.exists():
            return cls(path)
        try:
            document = _read_document(path)
        except OSError as exc:
            raise ValidationError(
                f"cannot read config file {path}: {exc.strerror}", f"check the permissions of {path}"
            ) from exc
        return cls(path, _parse(path, document))

    # --- reading ----------------------------------------------------------------------------
    def _where(self) -> str:
        """Which client config was read, said when a machine is not in it (another $REDIACC_CONFIG,
        an empty or missing file are the usual reasons)."""
        if self.path == Path(os.devnull):
            return ""
        if not self.path.exists():
            return f" (there is no client config at {self.path})"
        return f" in {self.path}" + ("" if self.entries else " (it names no machines)")

    def names(self) -> list[str]:
        return [LOCALHOST, *sorted(name for name in self.entries if name != LOCALHOST)]

    def machines(self) -> list[Machine]:
        """Every machine, those whose root has vanished included (listings show them as such)."""
        return [self.machine(name, present=False) for name in self.names()]

    def machine(self, name: str, *, present: bool = True) -> Machine:
        """The machine `name`; with `present`, refused when its root directory is gone.

        Working on a vanished root would silently create a new, empty tree in its place.
        """
        if name == LOCALHOST:
            return Machine(LOCALHOST, Path("/"))
        entry = self.entries.get(name)
        if entry is None:
            import difflib  # late: only a mistyped name pays for it

            close = difflib.get_close_matches(name, [LOCALHOST, *self.entries], n=1)
            raise NotFoundError(
                f"no machine named {name!r}{self._where()}",
                (f"did you mean {close[0]}? " if close else "")
                + "run `rdc machine list` to see the machines, or add it: "
                f"`rdc machine add {name} --ssh root@<host>` (or `--root <dir>` for a simulated machine)",
            )
        ssh = entry.get("ssh")
        if ssh is not None:  # its root is on that machine: nothing here to check
            address = SshAddress.parse(ssh, entry.get("identity"))
            return Machine(name, Path(entry.get("root", "/")), remote=address)
        root = Path(entry["root"])
        if present and not root.is_dir():
            raise StateError(
                f"the root of machine {name}, {root}, does not exist any more (moved or deleted?)",
                f"restore {root}, or forget the machine with `rdc machine remove {name}`",
            )
        return Machine(name, root)

    @property
    def known_hosts(self) -> Path:
        """rdc's own known_hosts (host keys of SSH machines), beside the config file."""
        return self.path.parent / "known_hosts"

    def has(self, name: str) -> bool:
        return name == LOCALHOST or name in self.entries

    def old_settings(self, name: str) -> dict[str, str]:
        """Settings an older `rdc` recorded for `name` in this file; they have no effect any more."""
        return dict(self.entries.get(name, {}).get("settings", {}))

    # --- changing ---------------------------------------------------------------------------
    def add(self, name: str, root: Path) -> Machine:
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
        # Two machines on one root would each own the same repos: every reference would be ambiguous.
        for other in self.machines():
            if other.remote is None and other.root.resolve() == root.resolve():
                raise StateError(
                    f"machine {other.name} already has the root {other.root}",
                    f"use `{other.name}`, or remove it first with `rdc machine remove {other.name}`",
                )
        self.entries[name] = {"root": str(root)}
        return self.machine(name)

    def add_ssh(self, name: str, address: SshAddress, root: str | None = None) -> Machine:
        """Register a machine reached over SSH; `root` is a directory on that machine (`/` by default)."""
        check_machine_name(name)
        if self.has(name):
            raise StateError(
                f"a machine named {name!r} already exists",
                f"choose another name, or remove it first with `rdc machine remove {name}`",
            )
        if root is not None and not root.startswith("/"):
            raise ValidationError(f"--root {root!r} must be an absolute path on the machine", "e.g. --root /")
        entry: dict[str, Any] = {"ssh": str(address)}
        if address.identity:
            # Stored absolute: ssh runs from whatever directory the next command is typed in.
            entry["identity"] = os.path.abspath(os.path.expanduser(address.identity))
        if root not in (None, "/"):
            entry["root"] = root
        self.entries[name] = entry
        return self.machine(name)

    def remove(self, name: str) -> None:
        if name == LOCALHOST:
            raise ValidationError("localhost always exists and cannot be removed", "remove another machine")
        if name not in self.entries:
            self.machine(name, present=False)  # raises the not-found error
        del self.entries[name]

    def forget_old_settings(self, name: str) -> dict[str, str]:
        """Drop the old settings of `name` from this file (once they are managed on the machine)."""
        return dict(self.entries.get(name, {}).pop("settings", None) or {})

    def save(self) -> None:
        machines: dict[str, Any] = {}
        for name in sorted(self.entries):
            entry = {k: v for k, v in self.entries[name].items() if k != "settings" or v}
            if entry:
                machines[name] = entry
        import yaml

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
        raise bad("`machines` must be a mapping of machine name to {root}")
    entries: dict[str, dict[str, Any]] = {}
    for name, entry in machines.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise bad(f"invalid machine name {name!r}")
        if not isinstance(entry, dict):
            raise bad(f"machine {name!r} must be a mapping with `root`")
        extra = set(entry) - {"root", "settings", "ssh", "identity"}
        if extra:
            raise bad(f"machine {name!r} has unknown keys: {', '.join(sorted(map(str, extra)))}")
        root = entry.get("root")
        if name == LOCALHOST:
            if root not in (None, "/"):
                raise bad("localhost's root is always /")
        elif "ssh" in entry:
            _parse_ssh(name, entry, bad)
        elif not isinstance(root, str) or not root.startswith("/"):
            raise bad(f"machine {name!r} needs an absolute `root` path")
        # Settings an older `rdc` kept here: only their shape is checked, they are kept and ignored.
        settings = entry.get("settings") or {}
        if not isinstance(settings, dict):
            raise bad(f"machine {name!r}: `settings` must be a mapping")
        parsed: dict[str, Any] = {}
        if name != LOCALHOST and root is not None:
            parsed["root"] = root
        for key in ("ssh", "identity"):
            if key in entry:
                parsed[key] = entry[key]
        if settings:
            parsed["settings"] = {str(k): str(v) for k, v in settings.items()}
        entries[name] = parsed
    return entries


def _parse_ssh(name: str, entry: dict[str, Any], bad: Callable[[str], ValidationError]) -> None:
    if name == LOCALHOST:
        raise bad("localhost is this host; it has no `ssh` address")
    root, ssh, identity = entry.get("root"), entry.get("ssh"), entry.get("identity")
    if root is not None and (not isinstance(root, str) or not root.startswith("/")):
        raise bad(f"machine {name!r}: `root` must be an absolute path on the machine")
    if not isinstance(ssh, str) or (identity is not None and not isinstance(identity, str)):
        raise bad(f"machine {name!r}: `ssh` must be [USER@]HOST[:PORT] and `identity` a path")
    try:
        SshAddress.parse(ssh)
    except ValidationError as exc:
        raise bad(f"machine {name!r}: {exc.what}") from exc
