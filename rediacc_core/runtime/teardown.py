"""What `rdc repo down` does after stopping a repo's dockerd: make sure nothing of the repo is left.

Stopping dockerd normally stops its containers, its containerd and their shims, and unmounts its
filesystems. A tenant can defeat that: a process that left its container's cgroup (through a cgroup
mount) or that dockerd gave up stopping keeps running, its shim waits for it, and the repo's mounts
stay. So the repo's footprint is taken while the daemon still runs, and afterwards every process of
it is killed and every mount of it is unmounted, then checked again.

A process belongs to the repo when any of these holds:
- it is a container runtime process (containerd, a shim, runc, docker-proxy, dockerd) whose command
  line names the daemon's working directory or data-root (each repo daemon has its own);
- its cgroup names one of the daemon's containers (by the 64-hex id Docker puts in cgroup paths);
- it shares the mount namespace of one of the daemon's containers (every container has its own, and
  leaving it takes CAP_SYS_ADMIN in the host's namespace): this finds a process that escaped its
  cgroup, even one in the host's pid namespace.
A mount belongs to the repo when it lies under the daemon's working directory or data-root (and the
data-root itself when dockerd bound it onto itself).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from dataclasses import dataclass, field

from rediacc_core.pids import pid_alive
from rediacc_core.runtime.daemon import unmount
from rediacc_core.runtime.layout import DaemonPaths

KILL_TIMEOUT = 10.0  # seconds to wait for killed processes to be gone
_RUNTIME_PROGRAMS = frozenset(
    {"containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "docker-proxy", "dockerd"}
)
_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")
_TASKS = "containerd/daemon/io.containerd.runtime.v2.task/moby"
RUNTIME_WHY = "the repo daemon's runtime"  # how `processes` describes dockerd, containerd, shims


@dataclass(frozen=True)
class Footprint:
    """What identifies the repo daemon's processes: its paths, container ids and mount namespaces."""

    paths: DaemonPaths
    container_ids: frozenset[str] = frozenset()
    mount_namespaces: frozenset[str] = frozenset()


@dataclass
class Sweep:
    """What `sweep` did, for the user, and what it could not remove."""

    killed: list[str] = field(default_factory=list)
    unmounted: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def footprint(paths: DaemonPaths) -> Footprint:
    """The repo daemon's footprint, read from its directories and /proc (no daemon call: it may be
    down or hung). Take it before stopping the daemon: a container's init must still run for its
    mount namespace to be known."""
    ids: set[str] = set()
    with contextlib.suppress(OSError):
        ids.update(
            p.name for p in (paths.data_root / "containers").iterdir() if _CONTAINER_ID.fullmatch(p.name)
        )
    namespaces: set[str] = set()
    tasks = paths.exec_root / _TASKS
    with contextlib.suppress(OSError):
        for task in tasks.iterdir():
            if _CONTAINER_ID.fullmatch(task.name):
                ids.add(task.name)
            with contextlib.suppress(OSError, ValueError):
                pid = int((task / "init.pid").read_text().strip())
                namespaces.add(os.readlink(f"/proc/{pid}/ns/mnt"))
    return Footprint(paths, frozenset(ids), frozenset(namespaces - _host_namespaces()))


def _host_namespaces() -> set[str]:
    """Mount namespaces never to sweep: this process's and init's (a stale pid file must not point
    the sweep at the host)."""
    found = set()
    for pid in ("self", "1"):
        with contextlib.suppress(OSError):
            found.add(os.readlink(f"/proc/{pid}/ns/mnt"))
    return found


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def processes(fp: Footprint) -> dict[int, str]:
    """The live processes of the repo (pid -> short description)."""
    markers = tuple(os.fsencode(p) + b"/" for p in (fp.paths.workdir, fp.paths.data_root))
    ids = tuple(i.encode() for i in fp.container_ids)
    spared = {1, os.getpid()}
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in spared:
            continue
        pid = int(entry)
        argv = _read(f"/proc/{pid}/cmdline").split(b"\0")
        program = os.path.basename(argv[0]).decode(errors="replace") if argv and argv[0] else ""
        why = ""
        if program in _RUNTIME_PROGRAMS and any(a.startswith(markers) for a in argv[1:]):
            why = RUNTIME_WHY
        elif ids and any(i in _read(f"/proc/{pid}/cgroup") for i in ids):
            why = "in a container's cgroup"
        elif fp.mount_namespaces:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/mnt") in fp.mount_namespaces:
                    why = "in a container's mount namespace"
        if why and pid_alive(pid):
            name = program or _read(f"/proc/{pid}/comm").decode(errors="replace").strip() or "?"
            found[pid] = f"{name} (pid {pid}, {why})"
    return found


def mounts(fp: Footprint) -> list[str]:
    """The repo's mount points in this mount namespace, deepest first (the order to unmount)."""
    under = (str(fp.paths.workdir) + "/", str(fp.paths.data_root) + "/")
    data_root = str(fp.paths.data_root)
    # dockerd binds its data-root onto itself (to make it private) and leaves this file to say so.
    own_bind = (fp.paths.exec_root / "unmount-on-shutdown").exists()
    found = []
    for line in _read("/proc/self/mountinfo").decode(errors="replace").splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point.startswith(under) or (own_bind and point == data_root):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def _unescape(text: str) -> str:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def sweep(fp: Footprint, timeout: float = KILL_TIMEOUT) -> Sweep:
    """Kill the repo's processes, unmount its mounts, and say what is still there (normally nothing)."""
    done = Sweep()
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = processes(fp)
        if not found:
            break
        for pid, what in found.items():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                # Said once per process: one still exiting may read differently on the next pass
                # (its command line is gone before its namespaces are).
                if pid not in killed:
                    killed.add(pid)
                    done.killed.append(what)
        time.sleep(0.1)
    for _ in range(5):  # mounts stacked on one point come off one per pass
        progress = False
        for point in mounts(fp):
            if unmount(point) is None:
                done.unmounted.append(point)
                progress = True
        if not progress:
            break
    done.left = [*processes(fp).values(), *(f"mount {p}" for p in mounts(fp))]
    return done
