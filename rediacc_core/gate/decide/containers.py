"""What a container of the repo holds, asked of the repo's daemon when a request would make it run:
its CDI names and the host ports it publishes.

The gate admits CDI names at create, but the daemon injects the devices again at every start, so a
start, restart, unpause or exec of a container created while a grant was in force must be checked
against the grants in force now. The daemon's own record of the container (its `HostConfig`, as the
gate admitted it) says which CDI names it holds; an exec instance is first traced to its container.

Asking waits on the daemon, so it happens only in a decision's worker thread (`may_block`).
Nothing is cached: a name can be given to another container at any time, and one inspect costs far
less than the start it guards.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rediacc_core import unixhttp
from rediacc_core.blocking import may_block
from rediacc_core.gate.policy.publish import Binding, bindings
from rediacc_core.gate.wire.devicerequests import cdi_names

LOOKUP_TIMEOUT = 5.0


class LookupFailed(Exception):
    """The daemon could not be asked (down, slow, or an answer the gate cannot read)."""


@dataclass(frozen=True)
class Container:
    """One container as its daemon records it: the CDI names it injects when it runs, the host
    ports it publishes, whether it runs. The one reading of a container inspect document, for the
    gate's start decisions and for the runtime's holders (`runtime.holdings`)."""

    id: str
    name: str
    cdi: tuple[str, ...]
    # The host ports it publishes when it runs (the image's exposed ports merged in for `-P`), and
    # whether it runs now (a restart then binds what the repo already publishes).
    ports: tuple[Binding, ...] = ()
    running: bool = False
    state: str = ""  # the daemon's State.Status: running, paused, exited, created, ...
    # Made with `--rm`: the daemon removes it when it stops, or when its own start fails.
    auto_remove: bool = False


@runtime_checkable
class ContainerRemover(Protocol):
    def remove(self, container_id: str) -> str | None:
        """Remove the container with its anonymous volumes, as the daemon removes a `--rm` container
        whose start failed; None when removed, else why not."""


class ContainerLookup(Protocol):
    def lookup(self, ref: str) -> Container | None:
        """The container `ref` (id, prefix or name) names, or None when the daemon has none."""

    def exec_container(self, exec_id: str) -> str | None:
        """The id of the container an exec instance belongs to, or None when there is no such exec."""


def container_from_inspect(document: Mapping[str, Any]) -> Container:
    """The `Container` of a container inspect document (`GET /containers/{id}/json`)."""
    host = document.get("HostConfig")
    host = host if isinstance(host, dict) else {}
    name = document.get("Name")
    config, state = document.get("Config"), document.get("State")
    exposed = config.get("ExposedPorts") if isinstance(config, dict) else None
    # What does not read was refused at create; at start only what the daemon will bind counts.
    ports, _ = bindings(host, exposed if isinstance(exposed, dict) else {})
    return Container(
        id=str(document.get("Id", "")),
        name=name.lstrip("/") if isinstance(name, str) else "",
        cdi=cdi_names(host or None),
        ports=tuple(ports),
        running=isinstance(state, dict) and state.get("Running") is True,
        state=str(state.get("Status", "")) if isinstance(state, dict) else "",
        auto_remove=host.get("AutoRemove") is True,
    )


class DaemonContainers:
    """`ContainerLookup` over the repo daemon's own socket."""

    def __init__(self, upstream: Path, timeout: float = LOOKUP_TIMEOUT) -> None:
        self.upstream = upstream
        self.timeout = timeout

    def _get(self, target: str) -> Any:
        may_block()
        try:
            status, body = unixhttp.request(self.upstream, "GET", target, timeout=self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise LookupFailed(f"the repo's daemon did not answer ({exc})") from exc
        if status == 404:
            return None
        try:
            document = json.loads(body) if status == 200 else None
        except ValueError:
            document = None
        if not isinstance(document, dict | list):
            raise LookupFailed(f"the repo's daemon answered {status} to {target}")
        return document

    def lookup(self, ref: str) -> Container | None:
        document = self._get(f"/containers/{urllib.parse.quote(ref, safe='')}/json")
        return container_from_inspect(document) if isinstance(document, dict) else None

    def ids(self) -> list[str]:
        """The id of every container of the daemon, running or not."""
        listed = self._get("/containers/json?all=1")
        entries = listed if isinstance(listed, list) else []
        return [e["Id"] for e in entries if isinstance(e, dict) and isinstance(e.get("Id"), str)]

    def remove(self, container_id: str) -> str | None:
        may_block()
        target = f"/containers/{urllib.parse.quote(container_id, safe='')}?force=1&v=1"
        try:
            status, body = unixhttp.request(self.upstream, "DELETE", target, timeout=self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            return f"the repo's daemon did not answer ({exc})"
        if status in (204, 404, 409):  # 409: the daemon is removing it already
            return None
        return f"the repo's daemon answered {status}: {body.decode(errors='replace')[:200]}"

    def exec_container(self, exec_id: str) -> str | None:
        document = self._get(f"/exec/{urllib.parse.quote(exec_id, safe='')}/json")
        found = document.get("ContainerID") if isinstance(document, dict) else None
        return found if isinstance(found, str) and found else None
