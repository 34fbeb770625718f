"""What a repo's gate does, every housekeeping round, about running containers whose grant ended.

A grant ends at a lease's end (or by a revoke without `--stop`); from then on its holders cannot
start again (the gate and the runtime guard refuse), but one already running keeps its device open.
The machine's `lease-end` setting says whether that may go on (`keep`, the default: a job is not
killed mid-run unless asked) or whether the gate stops such containers (`stop`): within one
housekeeping interval (30 s) of the end, with no `rdc` process running.
"""

from __future__ import annotations

from collections.abc import Callable

from rediacc_core.errors import RdcError
from rediacc_core.grants import read_grants
from rediacc_core.holdings import Holder, repo_holders, stop_holder
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.settings import effective, read_settings


def stop_lapsed_holders(
    machine: Machine,
    repo: Repo,
    log: Callable[[str], None],
    *,
    holders: Callable[[], list[Holder] | None] | None = None,
    stop: Callable[[Holder], None] | None = None,
) -> list[Holder]:
    """Stop the repo's running containers that hold a name it is no longer granted, when the
    machine's `lease-end` setting is `stop`; returns those stopped."""
    try:
        if effective(read_settings(machine))["lease-end"] != "stop":
            return []
        held = {g.device for g in read_grants(machine) if g.repo_id == repo.id}
    except RdcError as exc:  # unreadable settings or grants: stop nothing, say why, try again later
        log(f"lease-end check skipped: {exc.what}")
        return []
    stopped = []
    for holder in (holders or (lambda: repo_holders(machine, repo)))() or ():
        lapsed = [name for name in holder.cdi if name not in held]
        if holder.running and lapsed:
            try:
                (stop or (lambda h: stop_holder(machine, h)))(holder)
            except RdcError as exc:
                log(f"lease-end: {exc.what}")
                continue
            log(f"lease-end: stopped container {holder.name}, whose grant of {', '.join(lapsed)} ended")
            stopped.append(holder)
    return stopped
