"""Host paths as the daemon and the kernel will read them, on any machine root.

A request names host paths as text; what reaches the container is where that text lands after the
daemon cleans it (`filepath.Clean`) and the kernel follows symlinks. Rules judge the landing place,
so `/mnt/link/..` or a link into `/dev` cannot hide what a path really names.
"""

from __future__ import annotations

import os
import posixpath
import stat

from rediacc_core.machine import Machine

MAX_SYMLINKS = 40  # the kernel's own limit on links followed in one lookup


def clean(path: str) -> str:
    """`path` as Go's `filepath.Clean` leaves it, made absolute (relative paths start at `/`)."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def resolve(machine: Machine, path: str) -> str | None:
    """The machine-absolute path `path` leads to, or None for a symlink loop.

    Symlinks are followed inside the machine root. `..` after a symlink steps out of the link's
    target, as the kernel does; components that do not exist are kept as written (the daemon
    creates missing bind sources as directories).
    """
    pending = [p for p in reversed(path.split("/")) if p]
    resolved: list[str] = []
    links = 0
    existing = True
    while pending:
        part = pending.pop()
        if part == ".":
            continue
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        resolved.append(part)
        if not existing:
            continue
        host = machine.path("/" + "/".join(resolved))
        try:
            info = os.lstat(host)
        except OSError:
            existing = False
            continue
        if not stat.S_ISLNK(info.st_mode):
            continue
        links += 1
        if links > MAX_SYMLINKS:
            return None
        target = os.readlink(host)
        resolved.pop()
        if target.startswith("/"):
            resolved = []
        pending.extend(p for p in reversed(target.split("/")) if p)
    return "/" + "/".join(resolved)


def landing_paths(machine: Machine, raw: str) -> tuple[str, ...]:
    """Every place `raw` may land: as written (resolved), and cleaned first then resolved.

    A symlink loop lands nowhere; the cleaned text is kept so a rule can still judge it.
    """
    cleaned = clean(raw)
    found = [cleaned]
    for candidate in (resolve(machine, raw if raw.startswith("/") else "/" + raw), resolve(machine, cleaned)):
        if candidate is not None and candidate not in found:
            found.append(candidate)
    return tuple(found)


def is_at_or_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")
