"""A repo's files directory, mounted nosuid,nodev while the repo is up: what a container leaves there
gives host users nothing.

Container root is host root, so a tenant can leave a set-user-ID-root program or a device node
(`mknod c 1 11`, the kernel log; a raw disk on a real host) in its files directory. `secure` binds
the directory onto itself and remounts that bind nosuid,nodev: the kernel then ignores set-user-ID
bits and refuses to open device nodes on every path through it, the host's and the gate's pins (a
bind copies the flags of the mount it is taken from; pins are hardened themselves besides), and so
the containers' binds of those. Above it, the state directory is root's alone (0700,
`repos.make_state_dirs`): no host user reaches the files at all; the mount holds where that does not
(a descriptor handed out, a mode loosened by hand).

The mount made is recorded in `files.mount` beside the directory (the boot and the mount's id), so
`release` (`rdc repo down`) takes off exactly that mount, and `secure` run again (every `rdc repo up`,
`rdc repo gate run` for the gate unit, after a crash) adds none. A files directory the host already
mounts nosuid,nodev needs none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rediacc_core.errors import StateError
from rediacc_core.files import atomic_write_json
from rediacc_core.gate.policy import pins
from rediacc_core.machine import Machine
from rediacc_core.repos import files_dir, make_state_dirs
from rediacc_core.runtime.daemon import unmount

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_MOUNTINFO = Path("/proc/self/mountinfo")


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo, as far as this module needs it."""

    mount_id: int
    parent_id: int
    point: str


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts `text` (the format of /proc/self/mountinfo) lists, in its order."""
    found = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 5 or not (fields[0].isdigit() and fields[1].isdigit()):
            continue
        # The kernel writes space, tab, newline and backslash in a path as octal escapes.
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        found.append(Mount(int(fields[0]), int(fields[1]), point))
    return found


def read_mountinfo() -> list[Mount]:
    return parse_mountinfo(_MOUNTINFO.read_text(errors="replace"))


def top_at(point: str, mounts: Sequence[Mount]) -> Mount | None:
    """The mount a lookup of `point` finds: of those stacked on it, the one nothing is stacked on."""
    stacked = [m for m in mounts if m.point == point]
    tops = [m for m in stacked if not any(other.parent_id == m.mount_id for other in stacked)]
    return tops[-1] if tops else None


def marker_path(files: Path) -> Path:
    return files.with_name(files.name + ".mount")


def _boot_id() -> str:
    return _BOOT_ID.read_text().strip()


def recorded(files: Path, mounts: Sequence[Mount]) -> Mount | None:
    """The mount `secure` made on `files` in this boot, when it is still there."""
    try:
        entry = json.loads(marker_path(files).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("bootId") != _boot_id():
        return None  # made before a reboot: the mount went with it
    point = os.path.realpath(files)
    return next((m for m in mounts if m.mount_id == entry.get("mountId") and m.point == point), None)


def secure(files: Path) -> bool:
    """Make `files` a nosuid,nodev mount unless it is one; True when it mounted or remounted."""
    point = os.path.realpath(files)
    if pins.hardened(point):
        return False  # ours from before, or the host's own mount is nosuid,nodev
    mounts = read_mountinfo()
    ours = recorded(files, mounts)
    if ours is not None and top_at(point, mounts) == ours:
        pins.harden(point)  # ours, remounted since without the flags
        return True
    # Recursive, so that whatever the operator mounted below the directory stays visible.
    pins.bind(point, point, recursive=True)
    made = top_at(point, read_mountinfo())
    try:
        if made is None:
            raise OSError(0, f"the bind of {point} onto itself is not in /proc/self/mountinfo")
        atomic_write_json(marker_path(files), {"bootId": _boot_id(), "mountId": made.mount_id})
        pins.harden(point)
    except OSError:
        unmount(point)
        with contextlib.suppress(FileNotFoundError):
            marker_path(files).unlink()
        raise
    return True


def release(files: Path) -> bool:
    """Unmount what `secure` mounted on `files`; True when it did. Raises StateError naming the mount
    when it stays."""
    marker = marker_path(files)
    if not marker.exists():
        return False
    point = os.path.realpath(files)
    mounts = read_mountinfo()
    ours = recorded(files, mounts)
    if ours is not None:
        stacked = top_at(point, mounts) != ours
        why = "another mount is stacked on it" if stacked else unmount(point)
        if why is not None:
            raise StateError(
                f"the nosuid,nodev mount of the files directory {point} cannot be unmounted: {why}",
                f"unmount it as root (umount {point}), then run rdc repo down again",
            )
    marker.unlink()
    return ours is not None


def secure_repo(machine: Machine, repo_id: str) -> None:
    """At `rdc repo up` and `rdc repo gate run`: the repo's state directory 0700, its files directory a
    nosuid,nodev mount. A gate that is not root pins no binds (pinning mounts), so its containers
    bind nothing from the files directory and there is nothing to mount."""
    if os.geteuid() != 0:
        return
    files = make_state_dirs(machine, repo_id)
    try:
        secure(files)
    except OSError as exc:
        raise StateError(
            f"cannot mount the files directory {files} nosuid,nodev: {exc.strerror or exc}",
            "run rdc repo up as root on a host that allows mounts (outside a container, or in one "
            "with CAP_SYS_ADMIN)",
        ) from exc


def release_repo(machine: Machine, repo_id: str) -> None:
    """At `rdc repo down` and `rdc repo delete`: take off the files directory's mount (see
    `release`); only root mounts it."""
    if os.geteuid() == 0:
        release(files_dir(machine, repo_id))
