"""What a repo's gate does, every housekeeping round, about running containers whose grant ended.

A grant ends at a lease's end (or by a revoke without `--stop`); from then on its holders cannot
start again (the gate and the runtime guard refuse), but one already running keeps its device open.
The machine's `lease-end` setting says whether that may go on (`keep`, the default: a job is not
killed mid-run unless asked) or whether the gate stops such containers (`stop`): within one
housekeeping interval (30 s) of the end, with no `rdc` process running.

With `stop`, a container counts by what its processes hold, not only by the CDI names it was made
with: any container of the repo with a process holding a node of a device the repo is not granted
now (a descriptor passed to it over a socket, a node opened through a hard link) is stopped too.
A process outside any container cannot be stopped this way: the log names it and `rdc repo down`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from rediacc_core.cdi.registry import Registry
from rediacc_core.errors import RdcError
from rediacc_core.grants.records import reachable, read_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.runtime.holdings import Holder, clear_openers, nodes_of, repo_holders, stop_holder
from rediacc_core.runtime.openers import Node, Opener
from rediacc_core.settings import effective, read_settings
from rediacc_core.telemetry import export


def stop_lapsed_holders(
    machine: Machine,
    repo: Repo,
    log: Callable[[str], None],
    *,
    holders: Callable[[], list[Holder] | None] | None = None,
    stop: Callable[[Holder], None] | None = None,
    openers: Callable[[Repo, Collection[Node]], list[Opener]] | None = None,
) -> list[Holder]:
    """Stop the repo's running containers that hold a name it is no longer granted, or whose
    processes hold a node of a device it is not granted, when the machine's `lease-end` setting is
    `stop`; returns those stopped."""
    try:
        if effective(read_settings(machine))["lease-end"] != "stop":
            return []
        # A grant setup suspended (its name reaches other hardware now) is no grant here either.
        granted = {g.device for g in reachable(read_grants(machine)) if g.repo_id == repo.id}
    except RdcError as exc:  # unreadable settings or grants: stop nothing, say why, try again later
        log(f"lease-end check skipped: {exc.what}")
        return []
    stopper = stop or (lambda h: stop_holder(machine, h))
    stopped = []
    for holder in (holders or (lambda: repo_holders(machine, repo)))() or ():
        lapsed = [name for name in holder.cdi if name not in granted]
        if holder.running and lapsed:
            try:
                stopper(holder)
            except RdcError as exc:
                log(f"lease-end: {exc.what}")
                continue
            log(f"lease-end: stopped container {holder.name}, whose grant of {', '.join(lapsed)} ended")
            stopped.append(holder)
    try:
        nodes = nodes_of(machine, Registry.for_machine(machine).names(), granted)
        by_node, left = clear_openers(machine, repo, nodes, find=openers, stop=stopper)
    except RdcError as exc:
        log(f"lease-end: {exc.what}")
        return stopped
    for holder in by_node:
        log(
            f"lease-end: stopped container {holder.name}, whose processes held a device not granted: "
            + "; ".join(holder.opened)
        )
    for opener in left:
        log(
            f"lease-end: {opener.describe()}, not granted, outside a container it can stop: "
            f"`rdc repo down {repo.ref}` ends it"
        )
    return stopped + by_node


def refresh_telemetry(machine: Machine, log: Callable[[str], None]) -> None:
    """Bring the GPU telemetry up to date: a lease ends without a write to the grants file, so each
    housekeeping round exports the grants in force (nothing is written when nothing changed)."""
    try:
        grants = read_grants(machine)
    except RdcError as exc:
        log(f"GPU telemetry skipped: {exc.what}")
        return
    problem = export(machine, grants)
    if problem:
        log(problem)
