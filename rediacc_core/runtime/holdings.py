"""Holders: the containers of a repo that hold CDI devices, read from the repo's own daemon.

A container holds the CDI names of its `HostConfig.DeviceRequests` (driver `cdi`): the daemon
injects them at every start. Revoking a name does not take it from a container that is running
(its device nodes stay open), so `rdc repo gpu revoke` names the holders, and an exclusive grant
is refused while another repo's container runs with the same hardware. A stopped
holder cannot run again without the grant: the gate refuses its start and the runtime guard
(`runtime.guard`) refuses whoever else starts it.

A container's CDI names are not all it can hold: a process may have a descriptor of a device's node
that it was handed, or opened under another name. So revoke, exclusive grants and a lease's end also
find the repo's processes holding the nodes by device number (`runtime.openers`), to name them.
Neither is all a repo may hold (a descriptor in flight shows in no scan): taking hardware away
empties the repo (`grants.release`), with the running containers and outside processes read here.

The daemon is asked over its own socket (root only), never through the gate, with the gate's own
client for a container's record (`gate.containers`). This module also stops containers, writes the
handover's audit lines, and gathers all of it as `Holdings`: what an exclusive grant is handed
(`grants.handover.RunningParts`), so the grant records themselves never reach a daemon or /proc.
"""

from __future__ import annotations

import contextlib
import http.client
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from rediacc_core import unixhttp
from rediacc_core.errors import StateError
from rediacc_core.gate.decide.containers import DaemonContainers, LookupFailed
from rediacc_core.holders import RUNS, Node, Opener
from rediacc_core.holders import Holder as Holder  # made here, named by the grants
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.runtime import openers
from rediacc_core.runtime.layout import runtime_for

ASK_TIMEOUT = 10.0
STOP_TIMEOUT = 10  # seconds the daemon waits after SIGTERM before it kills a holder


def _socket(machine: Machine, repo: Repo) -> str:
    return str(runtime_for(machine, repo).upstream_socket)


def _daemon(machine: Machine, repo: Repo) -> DaemonContainers:
    """The repo daemon's containers, asked over its own socket (the gate's client, not the gate)."""
    return DaemonContainers(Path(_socket(machine, repo)), ASK_TIMEOUT)


def repo_holders(machine: Machine, repo: Repo) -> list[Holder] | None:
    """Every container of `repo` that holds a CDI device, running or not; None when its daemon is
    not running (then nothing of it runs, and nothing of it can start without the gate or the guard)."""
    daemon = _daemon(machine, repo)
    try:
        ids = daemon.ids()
    except LookupFailed:
        return None
    holders: list[Holder] = []
    for ident in ids:
        try:
            found = daemon.lookup(ident)
        except LookupFailed:
            continue
        if found is not None and found.cdi:  # None: removed meanwhile
            holders.append(Holder(repo, ident, found.name or ident[:12], found.state, found.cdi))
    return sorted(holders, key=lambda h: h.name)


def running_containers(machine: Machine, repo: Repo) -> list[Holder]:
    """Every running, paused or restarting container of `repo`, whatever it holds ([] when its
    daemon is not running): what emptying the repo stops (`grants.release`)."""
    daemon = _daemon(machine, repo)
    try:
        ids = daemon.ids()
    except LookupFailed:
        return []
    found: list[Holder] = []
    for ident in ids:
        try:
            record = daemon.lookup(ident)
        except LookupFailed:
            record = None  # unreadable now: it counts as running, so the emptying looks again
            found.append(Holder(repo, ident, ident[:12], "unknown", ()))
        if record is not None and record.state in RUNS:
            found.append(Holder(repo, ident, record.name or ident[:12], record.state, record.cdi))
    return sorted(found, key=lambda h: h.name)


def outside_processes(machine: Machine, repo: Repo) -> list[str]:
    """The processes of `repo` that run outside its running containers: not its daemon's runtime
    (dockerd, containerd, shims, docker-proxy), not in the cgroup of a container that runs. One
    that left its container's cgroup survives `docker stop`; only `rdc repo down` ends it."""
    from rediacc_core.runtime import teardown

    runtime = runtime_for(machine, repo)
    if not runtime.owns_daemon:
        return []
    running = {c.id for c in running_containers(machine, repo)}
    fp = teardown.footprint(runtime.daemon_paths)
    return [
        what
        for pid, what in sorted(teardown.processes(fp).items())
        if teardown.RUNTIME_WHY not in what and openers.container_of(pid, running) is None
    ]


def stop_holder(machine: Machine, holder: Holder, timeout: int = STOP_TIMEOUT) -> None:
    """Stop a running holder through its repo's daemon (SIGTERM, then SIGKILL after `timeout` s)."""
    sock = _socket(machine, holder.repo)
    target = f"/containers/{holder.id}/stop?t={timeout}"
    try:
        status, body = unixhttp.request(sock, "POST", target, timeout=timeout + ASK_TIMEOUT)
    except (OSError, http.client.HTTPException) as exc:
        raise StateError(
            f"could not stop container {holder.name} of repo {holder.repo.ref}: {exc}",
            f"stop it with `docker stop {holder.name}` against the repo's gate (rdc repo docker-host "
            f"{holder.repo.ref})",
        ) from exc
    if status not in (204, 304, 404):
        raise StateError(
            f"could not stop container {holder.name} of repo {holder.repo.ref}: the daemon answered "
            f"{status} {body[:200].decode(errors='replace')}",
            f"stop it with `docker stop {holder.name}` against the repo's gate",
        )


def stop_command(holder: Holder) -> str:
    """The command that stops `holder`, as a user of its repo types it."""
    return f"DOCKER_HOST=$(rdc repo docker-host {holder.repo.ref}) docker stop {holder.name}"


# --- handing hardware over -------------------------------------------------------------------------


def _device_nodes(machine: Machine, names: Iterable[str]) -> set[Node]:
    """The device number of every node the CDI devices `names` inject (their host nodes, stat'ed now)."""
    from rediacc_core.cdi.registry import Registry
    from rediacc_core.cdi.spec import device_nodes

    registry = Registry.for_machine(machine)
    found: set[Node] = set()
    for name in names:
        entry = registry.get(name)
        if entry is None:
            continue
        for node in device_nodes(entry.spec, entry.name):
            path = node.get("path")
            host = node.get("hostPath", path)
            number = openers.node_of(host) if isinstance(host, str) else None
            if number is not None:
                found.add(number)
    return found


def nodes_of(machine: Machine, names: Iterable[str], besides: Iterable[str] = ()) -> set[Node]:
    """The nodes of `names` that none of `besides` injects: a repo still granted `besides` may hold
    those (a vendor's control node, or a card's node that its partitions share, is in several names)."""
    return _device_nodes(machine, names) - _device_nodes(machine, besides)


def device_openers(machine: Machine, repo: Repo, nodes: Iterable[Node]) -> list[Opener]:
    """Every process of `repo` (its containers' and its daemon's own) holding one of `nodes`, by
    device number, whatever path it shows and whether or not a container with the CDI name runs."""
    from rediacc_core.runtime import teardown

    wanted = set(nodes)
    runtime = runtime_for(machine, repo)
    if not runtime.owns_daemon or not wanted:
        return []
    fp = teardown.footprint(runtime.daemon_paths)
    return openers.openers(teardown.processes(fp), wanted, fp.container_ids)


def opener_containers(machine: Machine, repo: Repo, found: Iterable[Opener]) -> list[Holder]:
    """The containers the processes in `found` belong to, named by the repo's daemon, each with
    what its processes hold (processes outside any container are not among them)."""
    daemon = _daemon(machine, repo)
    held: dict[str, list[str]] = {}
    for opener in found:
        if opener.container is not None:
            held.setdefault(opener.container, []).append(opener.describe())
    containers = []
    for ident, what in held.items():
        name, status = ident[:12], "running"
        with contextlib.suppress(LookupFailed):
            record = daemon.lookup(ident)
            if record is not None:
                name, status = record.name or name, record.state or status
        containers.append(Holder(repo, ident, name, status, (), tuple(what)))
    return sorted(containers, key=lambda h: h.name)


def openers_report(machine: Machine, repo: Repo, left: Iterable[Opener]) -> tuple[list[str], list[str]]:
    """For each process in `left`, what it holds and in which container of `repo`; and the commands
    that end them: `docker stop` of the container, or `rdc repo down` for a process outside any."""
    found = list(left)
    names = {h.id: h.name for h in opener_containers(machine, repo, found)}
    lines, commands = [], []
    for opener in found:
        if opener.container is None:
            lines.append(f"{opener.describe()}, outside any container of {repo.ref}")
            commands.append(f"rdc repo down {repo.ref}")
        else:
            name = names.get(opener.container, opener.container[:12])
            lines.append(f"{opener.describe()}, in container {name} of {repo.ref}")
            commands.append(f"DOCKER_HOST=$(rdc repo docker-host {repo.ref}) docker stop {name}")
    return lines, list(dict.fromkeys(commands))


def record_handover(
    machine: Machine, old: Repo, new: Repo, names: Iterable[str], stopped: Iterable[Holder]
) -> None:
    """One line in each repo's audit log: which devices went from `old` to `new`, and what was stopped."""
    from rediacc_core.gate.audit.log import append_event

    devices = list(names)
    containers = [h.name for h in stopped if h.repo.id == old.id]
    message = (
        f"{', '.join(devices)} granted exclusively to {new.ref}, handed over from {old.ref}: "
        f"stopped {', '.join(containers) or 'nothing'}; nothing of {old.ref} runs that could hold them"
    )
    for repo in (old, new):
        append_event(
            runtime_for(machine, repo).audit_log,
            {"id": repo.id, "name": repo.name},
            endpoint="gpu-handover",
            decision="handover",
            cdi=devices,
            message=message,
        )


class Holdings:
    """The machine's running parts as granting asks about them (`grants.handover.RunningParts`): the
    containers and processes of each repo that hold a device, stopping them, and the handover's
    audit lines. Handed to `GrantStore` by its caller: the grant records never reach a daemon.

    It is also what emptying a repo asks (`grants.release.Emptier`): its running containers,
    stopping them, its processes outside any container.

    `holders`, `stop`, `openers`, `containers` and `outside` replace the daemon and /proc lookups
    (tests, simulations); with `holders` alone, the running ones among them are the containers."""

    def __init__(
        self,
        machine: Machine,
        *,
        holders: Callable[[Repo], list[Holder] | None] | None = None,
        stop: Callable[[Holder], None] | None = None,
        openers: Callable[[Repo, Collection[Node]], list[Opener]] | None = None,
        containers: Callable[[Repo], list[Holder]] | None = None,
        outside: Callable[[Repo], list[str]] | None = None,
    ) -> None:
        self.machine = machine
        self._holders = holders or (lambda repo: repo_holders(machine, repo))
        self._stop = stop or (lambda holder: stop_holder(machine, holder))
        self._openers = openers or (lambda repo, nodes: device_openers(machine, repo, nodes))
        if containers is None and holders is not None:
            containers = lambda repo: [h for h in holders(repo) or () if h.running]  # noqa: E731
        self._containers = containers or (lambda repo: running_containers(machine, repo))
        self._outside = outside or (lambda repo: outside_processes(machine, repo))

    def running(self, repo: Repo) -> list[Holder]:
        return self._containers(repo)

    def outside(self, repo: Repo) -> list[str]:
        return self._outside(repo)

    def holders(self, repo: Repo) -> list[Holder] | None:
        return self._holders(repo)

    def stop(self, holder: Holder) -> None:
        self._stop(holder)

    def openers(self, repo: Repo, nodes: Collection[Node]) -> list[Opener]:
        return self._openers(repo, nodes)

    def nodes_of(self, names: Iterable[str], besides: Iterable[str] = ()) -> set[Node]:
        return nodes_of(self.machine, names, besides)

    def openers_report(self, repo: Repo, left: Iterable[Opener]) -> tuple[list[str], list[str]]:
        return openers_report(self.machine, repo, left)

    def stop_command(self, holder: Holder) -> str:
        return stop_command(holder)

    def record_handover(self, old: Repo, new: Repo, names: Iterable[str], stopped: Iterable[Holder]) -> None:
        record_handover(self.machine, old, new, names, stopped)
