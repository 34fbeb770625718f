"""Which processes hold a device node, found by the kernel's device number, whatever the path.

A process keeps a device as long as it has a descriptor of the node or a memory map of it. Neither
is tied to a path: a descriptor handed to another container over a Unix socket (SCM_RIGHTS) reads
as the path inside the sender's mount namespace, a hard link of the node reads as the link's path,
and a map outlives the descriptor it was made from. So a node is matched by its type and
major:minor (`st_rdev`):
- a descriptor: `stat` of `/proc/<pid>/fd/<n>` is the stat of the open file itself;
- a memory map: the dev and inode `/proc/<pid>/maps` shows are those of the filesystem holding the
  node file, not the device's, so each mapped file is `stat`ed through `/proc/<pid>/map_files/`,
  which, like the fd links, reaches the mapped file itself (root only).
A process is put in its container by the 64-hex container id in its cgroup path.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Collection, Iterable, Mapping

from rediacc_core.holders import Node as Node  # made here, named by the grants
from rediacc_core.holders import Opener as Opener

_CONTAINER_ID = re.compile(rb"[0-9a-f]{64}")


def node_of(path: str) -> Node | None:
    """The device number of the node at `path` (followed), or None when it is no device node."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _node(st)


def _node(st: os.stat_result) -> Node | None:
    if stat.S_ISCHR(st.st_mode):
        return ("c", os.major(st.st_rdev), os.minor(st.st_rdev))
    if stat.S_ISBLK(st.st_mode):
        return ("b", os.major(st.st_rdev), os.minor(st.st_rdev))
    return None


def holds(pid: int, nodes: Collection[Node], proc: str = "/proc") -> list[tuple[Node, str]]:
    """Each of `nodes` that process `pid` holds, with how: its descriptors, then its memory maps."""
    found: list[tuple[Node, str]] = []
    fd_dir = f"{proc}/{pid}/fd"
    with contextlib.suppress(OSError):
        for fd in sorted(os.listdir(fd_dir), key=lambda n: int(n) if n.isdigit() else -1):
            with contextlib.suppress(OSError):
                node = _node(os.stat(f"{fd_dir}/{fd}"))
                if node is not None and node in nodes:
                    found.append((node, f"fd {fd} ({os.readlink(f'{fd_dir}/{fd}')})"))
    for area, path in _mapped_files(f"{proc}/{pid}/maps"):
        with contextlib.suppress(OSError):
            node = _node(os.stat(f"{proc}/{pid}/map_files/{area}"))
            if node is not None and node in nodes:
                found.append((node, f"a memory map of {path}"))
    return found


def _mapped_files(maps: str) -> list[tuple[str, str]]:
    """One address range ("start-end") and path per mapped file; anonymous maps skipped."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    with contextlib.suppress(OSError), open(maps, "rb") as handle:
        for line in handle:
            fields = line.split(maxsplit=5)
            if len(fields) < 5 or fields[4] == b"0":
                continue
            key = (fields[3].decode(), fields[4].decode())  # dev and inode of the file
            path = fields[5].strip().decode(errors="replace") if len(fields) > 5 else "?"
            seen.setdefault(key, (fields[0].decode(), path))
    return list(seen.values())


def container_of(pid: int, ids: Collection[str], proc: str = "/proc") -> str | None:
    """The container (one of `ids`) whose cgroup process `pid` is in."""
    try:
        with open(f"{proc}/{pid}/cgroup", "rb") as handle:
            text = handle.read()
    except OSError:
        return None
    for match in _CONTAINER_ID.finditer(text):
        if match.group().decode() in ids:
            return match.group().decode()
    return None


def openers(
    processes: Mapping[int, str], nodes: Iterable[Node], container_ids: Collection[str], proc: str = "/proc"
) -> list[Opener]:
    """Every process of `processes` (pid -> description) holding one of `nodes`, once per node and
    way it holds it, in pid order."""
    wanted = frozenset(nodes)
    if not wanted:
        return []
    found = []
    for pid in sorted(processes):
        held = holds(pid, wanted, proc)
        if held:
            container = container_of(pid, container_ids, proc)
            found += [Opener(pid, processes[pid], node, how, container) for node, how in held]
    return found
