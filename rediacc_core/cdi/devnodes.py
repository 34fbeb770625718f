"""Host device nodes as a CDI spec records them: `path` inside, `hostPath` on the host, numbers.

Recording type, major and minor means the runtime need not stat the node itself, and a simulated
machine (whose nodes may be plain files when `mknod` is not allowed) still describes real numbers.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class HostNode:
    host_path: Path
    type: str
    major: int
    minor: int


def sysfs_dev_numbers(dev_file: Path) -> tuple[int, int] | None:
    """`major:minor` from a sysfs `dev` file, the kernel's own record of a node's numbers."""
    try:
        major, minor = dev_file.read_text(encoding="utf-8").strip().split(":")
        return int(major), int(minor)
    except (OSError, ValueError):
        return None


def host_node(host_path: Path, recorded: tuple[int, int] | None = None) -> HostNode | None:
    """The node at `host_path` with its numbers; None when there is no node to map.

    A real node answers with its own `st_rdev`. Where the node exists but is not a device (a machine
    root prepared without the right to `mknod`), the kernel's sysfs record `recorded` is used.
    """
    try:
        st = os.stat(host_path)
    except OSError:
        return None
    if stat.S_ISCHR(st.st_mode):
        return HostNode(host_path, "c", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISBLK(st.st_mode):
        return HostNode(host_path, "b", os.major(st.st_rdev), os.minor(st.st_rdev))
    if recorded is None:
        return None
    return HostNode(host_path, "c", *recorded)


def device_node_edit(container_path: str, node: HostNode) -> dict[str, str | int]:
    """One CDI `deviceNodes` entry: `path` as the container sees it, `hostPath` under the machine root."""
    return {
        "path": container_path,
        "hostPath": str(node.host_path),
        "type": node.type,
        "major": node.major,
        "minor": node.minor,
    }
