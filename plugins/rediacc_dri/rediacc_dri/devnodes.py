"""The numbers of a host device node, which a CDI spec records so the runtime need not guess."""

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


def host_node(host_path: Path, recorded: tuple[int, int] | None) -> HostNode | None:
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
