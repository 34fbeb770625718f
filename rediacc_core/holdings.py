"""Holders: the containers of a repo that hold CDI devices, read from the repo's own daemon.

A container holds the CDI names of its `HostConfig.DeviceRequests` (driver `cdi`): the daemon
injects them at every start. Revoking a name does not take it from a container that is running
(its device nodes stay open), so `rdc repo gpu revoke` names the holders and can stop them, and an
exclusive grant is refused while another repo's container runs with the same hardware. A stopped
holder cannot run again without the grant: the gate refuses its start and the runtime guard
(`runtime.guard`) refuses whoever else starts it.

The daemon is asked over its own socket (root only), never through the gate.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rediacc_core import unixhttp
from rediacc_core.errors import StateError
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo

ASK_TIMEOUT = 10.0
STOP_TIMEOUT = 10  # seconds the daemon waits after SIGTERM before it kills a holder
_RUNS = frozenset({"running", "paused", "restarting"})


def cdi_names(host_config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every device id in the CDI device requests of a HostConfig (or update body), once each."""
    names: list[str] = []
    requests = host_config.get("DeviceRequests") if isinstance(host_config, Mapping) else None
    for request in requests if isinstance(requests, list) else ():
        if isinstance(request, dict) and request.get("Driver") == "cdi":
            ids = request.get("DeviceIDs")
            names.extend(i for i in (ids if isinstance(ids, list) else ()) if isinstance(i, str))
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Holder:
    """A container of `repo` that holds CDI devices."""

    repo: Repo
    id: str
    name: str
    state: str  # the daemon's State.Status: running, paused, exited, created, ...
    cdi: tuple[str, ...]

    @property
    def running(self) -> bool:
        """True while its processes may have the device nodes open (paused ones too)."""
        return self.state in _RUNS

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
        }


def _socket(machine: Machine, repo: Repo) -> str:
    from rediacc_core.runtime.lifecycle import runtime_for

    return str(runtime_for(machine, repo).upstream_socket)


def _get(sock: str, target: str) -> Any:
    status, body = unixhttp.request(sock, "GET", target, timeout=ASK_TIMEOUT)
    if status != 200:
        raise http.client.HTTPException(f"{target} answered {status}")
    return json.loads(body)


def repo_holders(machine: Machine, repo: Repo) -> list[Holder] | None:
    """Every container of `repo` that holds a CDI device, running or not; None when its daemon is
    not running (then nothing of it runs, and nothing of it can start without the gate or the guard)."""
    sock = _socket(machine, repo)
    try:
        listed = _get(sock, "/containers/json?all=1")
    except (OSError, http.client.HTTPException, ValueError):
        return None
    holders: list[Holder] = []
    for entry in listed if isinstance(listed, list) else ():
        ident = entry.get("Id") if isinstance(entry, dict) else None
        if not isinstance(ident, str):
            continue
        try:
            document = _get(sock, f"/containers/{urllib.parse.quote(ident, safe='')}/json")
        except (OSError, http.client.HTTPException, ValueError):
            continue  # removed meanwhile
        host = document.get("HostConfig")
        names = cdi_names(host if isinstance(host, dict) else None)
        if not names:
            continue
        state = document.get("State")
        status = state.get("Status") if isinstance(state, dict) else ""
        name = document.get("Name")
        holders.append(
            Holder(repo, ident, name.lstrip("/") if isinstance(name, str) else ident[:12], str(status), names)
        )
    return sorted(holders, key=lambda h: h.name)


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
