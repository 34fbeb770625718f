"""What bounds a container's share of the machine: its number of processes and its rlimits.

PIDs: a container forking without bound uses up the host's `kernel.pid_max`, and then no repo, no
gate and no sshd can fork. So every container gets the machine's `pids-limit` (4096 unless the
operator says otherwise): written into the canonical body when a create asks for none, and when a
create or update asks for unlimited (the daemon reads 0 and every negative value as unlimited); a
request above it is refused.

Rlimits: runc sets a container's rlimits while it still holds every capability, so an `rtprio`,
`nice` or `memlock` limit above the daemon's own gives SCHED_FIFO, nice -20 or unbounded mlock
without SYS_NICE or IPC_LOCK, which the capability policy gates. Those are refused above the hard
limits of the gate's own process, unless the machine allows the matching capability: the gate and
the repo's daemon are started by the same rdc and inherit the same limits, and reading its own
needs no daemon pid and gives the same answer on every request. Names the daemon does not know
are refused.
"""

from __future__ import annotations

import functools
import resource
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.wire.decode import BadRequest, canonicalise
from rediacc_core.gate.wire.decode_fields import ListOf, StructRef

DEFAULT_PIDS_LIMIT = 4096
MAX_PIDS_LIMIT = 4 * 1024 * 1024  # the kernel's PID_MAX_LIMIT: no pids.max above it means anything
UNLIMITED = -1  # how Docker writes RLIM_INFINITY

# go-units' names (the docker CLI's --ulimit); the daemon passes RLIMIT_<NAME> on to runc.
ULIMIT_NAMES = frozenset(
    {
        "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc",
        "rss", "rtprio", "rttime", "sigpending", "stack",
    }
)  # fmt: skip
# The rlimits bounded by the daemon's own, and the capability that lifts each bound.
GATED_ULIMITS: Mapping[str, tuple[int, str]] = MappingProxyType(
    {
        "rtprio": (resource.RLIMIT_RTPRIO, "SYS_NICE"),
        "nice": (resource.RLIMIT_NICE, "SYS_NICE"),
        "memlock": (resource.RLIMIT_MEMLOCK, "IPC_LOCK"),
    }
)
_ULIMITS = ListOf(StructRef("Ulimit"))


def check_pids_setting(value: str) -> str | None:
    """Why the `pids-limit` setting `value` is wrong, or None."""
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_PIDS_LIMIT:
        return f"a number of processes from 1 to {MAX_PIDS_LIMIT}"
    return None


def pids_limit(holder: dict[str, Any], where: str, ceiling: int, *, create: bool) -> Iterator[Finding]:
    """Write `ceiling` into `holder` where it asks for no limit; refuse a limit above `ceiling`.

    `create`: an absent PidsLimit means none (a create); in an update it means "unchanged".
    """
    value = holder.get("PidsLimit")
    if value is None:
        if create:
            holder["PidsLimit"] = ceiling
        return
    if not isinstance(value, int) or isinstance(value, bool):
        return  # the decoder admits only integers here
    if value <= 0:
        holder["PidsLimit"] = ceiling
    elif value > ceiling:
        yield refuse(
            "pids-limit",
            "PidsLimit",
            f"{where}PidsLimit {value} is refused: this machine lets a container have at most {ceiling} "
            "processes (one without bound could use up the host's process ids)",
            f"--pids-limit {ceiling} or less, or none ({ceiling} is the default); the operator sets the "
            "ceiling with rdc machine config M --set pids-limit=N",
        )


@functools.cache
def own_hard_limits() -> Mapping[str, int]:
    """The gate process's hard limit for each gated rlimit (`UNLIMITED` for infinity)."""
    limits = {}
    for name, (which, _) in GATED_ULIMITS.items():
        hard = resource.getrlimit(which)[1]
        limits[name] = UNLIMITED if hard == resource.RLIM_INFINITY else hard
    return MappingProxyType(limits)


def _above(value: int, ceiling: int) -> bool:
    if ceiling < 0:
        return False
    return value < 0 or value > ceiling  # a negative value reaches runc as an unsigned huge one


def ulimits(
    entries: Any, where: str, extra_caps: frozenset[str], hard: Mapping[str, int]
) -> Iterator[Finding]:
    """The rules for a list of `{Name, Soft, Hard}` (the canonical `Ulimit` structs)."""
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        name = entry.get("Name") or ""
        key = name.lower()  # the daemon upper-cases it into RLIMIT_<NAME>
        if key not in ULIMIT_NAMES:
            yield refuse(
                "ulimit",
                name,
                f"{where}Ulimits {name!r} is refused: not a limit the daemon knows",
                "one of " + ", ".join(sorted(ULIMIT_NAMES)),
            )
            continue
        gated = GATED_ULIMITS.get(key)
        if gated is None or gated[1] in extra_caps:
            continue
        ceiling = hard.get(key, 0)
        over = [
            f"{part.lower()} {value}"
            for part in ("Soft", "Hard")
            if _above(value := entry.get(part) or 0, ceiling)
        ]
        if over:
            yield refuse(
                "ulimit",
                name,
                f"{where}Ulimits {name} ({', '.join(over)}) is refused: above the daemon's own hard limit "
                f"of {ceiling}, it gives what only CAP_{gated[1]} should, which this machine does not allow",
                f"{name}={ceiling} or less, or the operator's "
                f"rdc machine config M --set extra-capabilities={gated[1]}",
            )


def build_ulimits(
    query: Mapping[str, tuple[str, ...]], extra_caps: frozenset[str], hard: Mapping[str, int]
) -> Iterator[Finding]:
    """`/build?ulimits=<JSON>`: the build steps' containers, read as the daemon reads the value."""
    for value in query.get("ulimits", ()):
        if not value:
            continue
        try:
            entries = canonicalise(value.encode("utf-8", "surrogateescape"), _ULIMITS)
        except BadRequest as exc:
            yield refuse(
                "ulimit",
                "ulimits",
                f"build ulimits cannot be read: {exc.message}",
                'a JSON list such as [{"Name":"nofile","Soft":1024,"Hard":2048}]',
            )
            continue
        yield from ulimits(entries, "build ", extra_caps, hard)
