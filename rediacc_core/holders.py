"""Who holds a device: a container by its CDI names (`Holder`), a process by a node it has open or
mapped (`Opener`), and the node itself by its kernel device number (`Node`).

Plain records on the records' floor, so the grants (which name holders in their results and in the
running parts they are handed) never import the running parts that find them (`runtime.holdings`,
`runtime.openers`, which make these and re-export them).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rediacc_core.repos import Repo

Node = tuple[str, int, int]  # "c" or "b", major, minor

# The daemon's container states in which its processes may have the device nodes open.
RUNS = frozenset({"running", "paused", "restarting"})


@dataclass(frozen=True)
class Opener:
    """One process holding one of the nodes: how (a descriptor or a map, and the path it shows),
    and the container whose cgroup it is in (None for the repo daemon's own or an escaped one)."""

    pid: int
    process: str  # what the caller knows of it, e.g. "sleep (pid 42, in a container's cgroup)"
    node: Node
    how: str  # "fd 3 (/gpu0)" or "a memory map of /dev/gpu0"
    container: str | None

    def describe(self) -> str:
        kind, major, minor = self.node
        return f"{self.process} holds device {kind} {major}:{minor} as {self.how}"


@dataclass(frozen=True)
class Holder:
    """A container of `repo` that holds CDI devices."""

    repo: Repo
    id: str
    name: str
    state: str  # the daemon's State.Status: running, paused, exited, created, ...
    cdi: tuple[str, ...]
    # What its processes hold of a device's nodes, when it is named for that rather than its CDI names.
    opened: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        """True while its processes may have the device nodes open (paused ones too)."""
        return self.state in RUNS

    def holds_any(self, names: Iterable[str]) -> tuple[str, ...]:
        wanted = set(names)
        return tuple(n for n in self.cdi if n in wanted)

    def to_json(self) -> dict[str, Any]:
        return {
            "repo": self.repo.ref,
            "container": self.name,
            "id": self.id,
            "state": self.state,
            "running": self.running,
            "devices": list(self.cdi),
            "opened": list(self.opened),
        }
