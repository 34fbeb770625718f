"""The CDI devices a machine defines: every spec in its spec dirs, resolved as the daemon does.

Resolution follows the reference cache exactly, because the gate must agree with the daemon about
which names exist: dirs are scanned in order, a later dir wins over an earlier one, and a device
defined twice at the same priority is a conflict that drops every copy. A broken file is recorded
and skipped; it never hides the devices of the other files.
"""

from __future__ import annotations

import difflib
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rediacc_core.cdi.names import CdiNameError, parse_qualified_name
from rediacc_core.cdi.spec import SPEC_SUFFIXES, CdiSpecError, Spec, load_spec

if TYPE_CHECKING:
    from rediacc_core.machine import Machine

# (path, inode, mtime in ns, size) per spec file, in scan order; equal means "nothing changed".
Fingerprint = tuple[tuple[str, int, int, int], ...]


@dataclass(frozen=True)
class DeviceEntry:
    """One resolved device: the spec that defines it and its name inside that spec."""

    spec: Spec
    name: str

    @property
    def qualified_name(self) -> str:
        return f"{self.spec.kind}={self.name}"


def _scan(directory: Path) -> list[os.DirEntry[str]]:
    """The entries of `directory` the CDI loader would read, in its (name) order.

    Only `.yaml` and `.json` names count; sub-directories are not descended into. A missing
    directory is normal (nothing is installed yet) and yields nothing.
    """
    try:
        with os.scandir(directory) as entries:
            found = [e for e in entries if e.name.endswith(SPEC_SUFFIXES) and not e.is_dir()]
    except FileNotFoundError:
        return []
    return sorted(found, key=lambda e: e.name)


def fingerprint(dirs: Sequence[Path]) -> Fingerprint:
    """A cheap summary of every spec file in `dirs` (stat only, no reads) for cache checks.

    A file that cannot be stat'ed (a dangling link) still counts, with -1s, so it showing up or
    going away changes the fingerprint.
    """
    rows: list[tuple[str, int, int, int]] = []
    for directory in dirs:
        try:
            entries = _scan(Path(directory))
        except OSError:
            rows.append((str(directory), -1, -1, -1))
            continue
        for entry in entries:
            try:
                st = entry.stat()
            except OSError:
                rows.append((entry.path, -1, -1, -1))
            else:
                rows.append((entry.path, st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(rows)


@dataclass
class Registry:
    """Resolved devices (`devices`: qualified name -> entry) plus what went wrong on the way.

    `errors` holds one line per spec file or dir that could not be used, each naming the path and why;
    `conflicts` maps each dropped qualified name to the spec files that defined it at the same priority.
    """

    dirs: tuple[Path, ...] = ()
    devices: dict[str, DeviceEntry] = field(default_factory=dict)
    specs: list[Spec] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    conflicts: dict[str, list[Path]] = field(default_factory=dict)
    loaded_fingerprint: Fingerprint = ()

    @staticmethod
    def fingerprint(dirs: Sequence[Path]) -> Fingerprint:
        return fingerprint(dirs)

    @classmethod
    def load(cls, dirs: Sequence[Path]) -> Registry:
        """Load every spec in `dirs` (lowest priority first) and resolve device names."""
        registry = cls(dirs=tuple(Path(d) for d in dirs))
        # Taken before reading, so a file changed while loading makes the next check reload.
        registry.loaded_fingerprint = fingerprint(registry.dirs)
        resolved: dict[str, tuple[DeviceEntry, int]] = {}
        for priority, directory in enumerate(registry.dirs):
            try:
                entries = _scan(directory)
            except OSError as exc:
                registry.errors.append(f"{directory}: cannot list CDI spec dir: {exc.strerror or exc}")
                continue
            for entry in entries:
                try:
                    spec = load_spec(Path(entry.path))
                except CdiSpecError as exc:
                    registry.errors.append(exc.what)
                    continue
                registry.specs.append(spec)
                registry._add(spec, priority, resolved)
        for name in registry.conflicts:
            # Dropped even when a later dir defines it again: the reference cache does the same.
            resolved.pop(name, None)
        registry.devices = {name: entry for name, (entry, _) in resolved.items()}
        return registry

    def _add(self, spec: Spec, priority: int, resolved: dict[str, tuple[DeviceEntry, int]]) -> None:
        for name in spec.device_names:
            entry = DeviceEntry(spec, name)
            qualified = entry.qualified_name
            previous = resolved.get(qualified)
            if previous is not None:
                old, old_priority = previous
                if old_priority > priority:
                    continue
                if old_priority == priority:
                    paths = self.conflicts.setdefault(qualified, [])
                    for path in (old.spec.path, spec.path):
                        if path is not None and path not in paths:
                            paths.append(path)
                    continue
            resolved[qualified] = (entry, priority)

    @classmethod
    def for_machine(cls, machine: Machine) -> Registry:
        """The devices a repo daemon on `machine` can inject (it reads only `<root>/etc/cdi`)."""
        return cls.load([machine.cdi_dir])

    def names(self) -> frozenset[str]:
        return frozenset(self.devices)

    def get(self, name: str) -> DeviceEntry | None:
        return self.devices.get(name)

    def conflict_messages(self) -> list[str]:
        """One sentence per conflicting name, for listings and error messages."""
        return [
            f"{name} is defined more than once at the same priority ({', '.join(map(str, paths))}); "
            "no copy is used"
            for name, paths in sorted(self.conflicts.items())
        ]


class RegistryCache:
    """A registry reloaded only when a spec file in its dirs changed; safe across threads."""

    def __init__(self, dirs: Sequence[Path]) -> None:
        self.dirs = tuple(Path(d) for d in dirs)
        self._lock = threading.Lock()
        self._registry: Registry | None = None

    def get(self) -> Registry:
        current = fingerprint(self.dirs)
        with self._lock:
            if self._registry is None or self._registry.loaded_fingerprint != current:
                self._registry = Registry.load(self.dirs)
            return self._registry


def suggest(name: str, names: Iterable[str], limit: int = 3) -> list[str]:
    """Defined names close to `name`, best first, for "did you mean" lines.

    Names of the same kind are preferred: a typo in the device part should not suggest another
    vendor's device that happens to share more letters.
    """
    pool = sorted(set(names))
    try:
        kind = parse_qualified_name(name).kind
    except CdiNameError:
        kind = None
    if kind is not None:
        same_kind = [n for n in pool if n.startswith(kind + "=")]
        # A name typed with a look-alike (O for 0, l or I for 1) comes first: it is what was meant.
        alike = [n for n in same_kind if _unconfused(n) == _unconfused(name)]
        close = difflib.get_close_matches(name, same_kind, n=limit, cutoff=0.5)
        close = [*alike, *(n for n in close if n not in alike)][:limit]
        if close:
            return close
    return difflib.get_close_matches(name, pool, n=limit, cutoff=0.6)


_LOOKALIKES = str.maketrans({"O": "0", "o": "0", "l": "1", "I": "1"})


def _unconfused(name: str) -> str:
    return name.translate(_LOOKALIKES)
