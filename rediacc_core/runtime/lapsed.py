"""What a repo's gate does, every housekeeping round, about running containers whose grant ended.

A grant ends at a lease's end (or by a revoke without `--stop`); from then on its holders cannot
start again (the gate and the runtime guard refuse), but one already running keeps its device open.
The machine's `lease-end` setting says whether that may go on (`keep`, the default: a job is not
killed mid-run unless asked) or whether the gate empties the repo (`stop`): within one
housekeeping interval (30 s) of the end, with no `rdc` process running.

With `stop`, the repo is emptied (`grants.release`: every running container of it is stopped, not
only those that hold the device, while none may start) when a lease of it ended, when a running
container of it holds a name it is no longer granted, or when a process of it holds a node of a
device it is not granted (a descriptor passed over a socket, a node opened through a hard link).
Only emptying covers a descriptor in flight in a socket's queue, which no scan sees. A process
outside any container cannot be stopped this way: the log names it and `rdc repo down`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from rediacc_core.cdi.registry import Registry
from rediacc_core.errors import RdcError
from rediacc_core.grants.records import reachable, read_all, read_grants, residue, write_grants
from rediacc_core.grants.release import empty_repos
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.runtime.holdings import Holder, Holdings, nodes_of
from rediacc_core.runtime.openers import Node, Opener
from rediacc_core.settings import effective, read_settings
from rediacc_core.statelock import state_lock
from rediacc_core.telemetry import export

LOCK_WAIT = 5.0  # seconds a round waits for the state lock (an rdc command holds it): the next round retries


def stop_lapsed_holders(
    machine: Machine,
    repo: Repo,
    log: Callable[[str], None],
    *,
    holders: Callable[[], list[Holder] | None] | None = None,
    stop: Callable[[Holder], None] | None = None,
    openers: Callable[[Repo, Collection[Node]], list[Opener]] | None = None,
    containers: Callable[[], list[Holder]] | None = None,
    outside: Callable[[], list[str]] | None = None,
) -> list[Holder]:
    """Empty the repo when the machine's `lease-end` setting is `stop` and a grant of it ended (a
    lease's end, or a running container or process holding what it is not granted); returns the
    containers stopped. The keyword arguments replace the daemon and /proc lookups (tests)."""
    try:
        if effective(read_settings(machine))["lease-end"] != "stop":
            return []
        # A grant setup suspended (its name reaches other hardware now) is no grant here either.
        granted = {g.device for g in reachable(read_grants(machine)) if g.repo_id == repo.id}
        ended = [r for r in residue(read_all(machine)) if r.repo_id == repo.id and r.how == "lease-end"]
    except RdcError as exc:  # unreadable settings or grants: stop nothing, say why, try again later
        log(f"lease-end check skipped: {exc.what}")
        return []
    parts = Holdings(
        machine,
        holders=(lambda _: holders()) if holders is not None else None,
        stop=stop,
        openers=openers,
        containers=(lambda _: containers()) if containers is not None else None,
        outside=(lambda _: outside()) if outside is not None else None,
    )
    try:
        why = _why_empty(machine, parts, repo, granted, ended)
        if not why:
            return []
        if not parts.running(repo) and not parts.outside(repo):
            if ended:  # it ran nothing when its lease ended: nothing of it can hold the hardware
                with state_lock(machine, LOCK_WAIT):
                    write_grants(machine, read_grants(machine), emptied=[repo.id])
            return []
        with state_lock(machine, LOCK_WAIT):
            emptied = empty_repos(
                machine, parts, [repo], why=f"a grant of repo {repo.ref} ended (lease-end=stop)"
            )
    except RdcError as exc:
        log(f"lease-end: {exc.what}" + (f"; {exc.todo}" if exc.todo else ""))
        return []
    for holder in emptied.stopped:
        log(f"lease-end: stopped container {holder.name}, {why.get(holder.id, _EMPTIED)}")
    return list(emptied.stopped)


_EMPTIED = "emptying the repo (a descriptor in flight shows in no scan)"


def _why_empty(
    machine: Machine, parts: Holdings, repo: Repo, granted: set[str], ended: Collection[object]
) -> dict[str, str]:
    """Why the repo is emptied, by container id ("" for the repo as a whole); empty when it is not."""
    why: dict[str, str] = {}
    for holder in parts.holders(repo) or ():
        lapsed = [name for name in holder.cdi if name not in granted]
        if holder.running and lapsed:
            why[holder.id] = f"whose grant of {', '.join(lapsed)} ended"
    nodes = nodes_of(machine, Registry.for_machine(machine).names(), granted)
    found = parts.openers(repo, nodes)
    for opener in found:
        if opener.container is not None and opener.container not in why:
            held = "; ".join(o.describe() for o in found if o.container == opener.container)
            why[opener.container] = f"whose processes held a device not granted: {held}"
    if found or ended:
        why.setdefault("", "a lease ended" if ended else "a device not granted is held")
    return why


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
