"""The host ports a container asks to publish, read as the daemon reads them, and the policy on them.

`HostConfig.PortBindings` maps a container port (`80/tcp`, `80` meaning tcp, `53/udp`) to bindings
`{HostIp, HostPort}`; HostPort is one port, a range the daemon picks one free port from
(`8000-8100`), or empty (or 0) for a port dockerd picks itself from its namespace's ephemeral range.
`PublishAllPorts` (`-P`) adds such an ephemeral binding for every exposed port without one. Only
tcp and udp bindings on every address (`-p 8080:80`) reach the host through the port keeper; the
rest stay inside the repo's namespace and are not this policy's business. Which address a binding
is on is the daemon's reading of `HostIp` (`wire/goip.py`): what Go's `net.ParseIP` does not read
(`[::1]`, `0.0.0.0 ` with a space, `127.000.0.1`, `fe80::1%eth0`) binds every address, and
`::ffff:0.0.0.0` is `0.0.0.0`.

Checked at create and again at start (from the daemon's record of the container, where the image's
exposed ports are merged in): the host ports against `publish-ports`, the repo's count against
`publish-limit`, and a fixed port against what the machine's other repos publish now.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rediacc_core import publishing
from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.wire.goip import bound_address
from rediacc_core.publishing import EPHEMERAL, Policy, Port

RULE = "publish-port"


@dataclass(frozen=True)
class Binding:
    """One host listener a container asks for."""

    key: str  # the container port as the request names it (`80/tcp`)
    proto: str
    low: int  # the host ports the daemon may choose from: low == high for one port, 0 for any
    high: int

    @property
    def ephemeral(self) -> bool:
        return self.low == 0

    @property
    def port(self) -> str:
        return self.key.split("/", 1)[0]


def _host_ports(text: str) -> tuple[int, int] | None:
    """A HostPort as the daemon parses it (a `/proto` suffix dropped), or None when it does not read."""
    value = text.split("/", 1)[0]
    if value == "":
        return 0, 0
    low, dash, high = value.partition("-")
    parts = (low, high) if dash else (low,)
    if not all(p.isascii() and p.isdigit() and len(p) <= 5 for p in parts):
        return None
    first, last = int(parts[0]), int(parts[-1])
    if first > last or last > 65535 or (first == 0 and last != 0):
        return None
    return first, last


def _proto(key: str) -> str:
    _, _, proto = key.partition("/")
    return (proto or "tcp").lower()


def bindings(host: Mapping[str, Any], exposed: Iterable[str]) -> tuple[list[Binding], list[Finding]]:
    """The bindings of `host` (a HostConfig) that reach the host, and refusals of what does not read.

    `exposed`: the container's exposed ports (the request's, with the image's where known), which
    `PublishAllPorts` publishes.
    """
    found: list[Binding] = []
    problems: list[Finding] = []
    table = host.get("PortBindings")
    table = table if isinstance(table, dict) else {}
    for key, entries in table.items():
        proto = _proto(key)
        for entry in entries if isinstance(entries, list) else []:
            entry = entry if isinstance(entry, dict) else {}
            address = bound_address(entry.get("HostIp") or "")
            if proto not in publishing.PROTOCOLS or address not in publishing.ANY_ADDRESS:
                continue
            raw = entry.get("HostPort") or ""
            ports = _host_ports(str(raw))
            if ports is None:
                problems.append(
                    refuse(
                        RULE,
                        str(raw),
                        f"HostConfig.PortBindings {key}: host port {raw!r} is not a port or LOW-HIGH range",
                        f"-p HOSTPORT:{key.split('/', 1)[0]}",
                    )
                )
                continue
            found.append(Binding(key, proto, *ports))
    if host.get("PublishAllPorts") is True:
        bound = set(table)
        for key in exposed:
            proto = _proto(key)
            if key not in bound and proto in publishing.PROTOCOLS:
                found.append(Binding(key, proto, 0, 0))
    return found, problems


@dataclass(frozen=True)
class Published:
    """What the publishing rules read besides the request: the policy, and what repos publish now."""

    policy: Policy = field(default_factory=lambda: publishing.policy_from({}))
    run_dir: Path | None = None  # the machine's run dir (None: no keeper state, as in unit tests)
    short_id: str = ""  # this repo's
    labels: Callable[[str], str] = lambda short: f"the repo whose id starts {short}"

    def own(self) -> frozenset[Port]:
        if self.run_dir is None:
            return frozenset()
        return publishing.read_state(publishing.state_file(self.run_dir, self.short_id))

    def others(self) -> dict[Port, str]:
        if self.run_dir is None:
            return {}
        return publishing.published_by_others(self.run_dir, self.short_id)


def _proto_suffix(binding: Binding) -> str:
    return "" if binding.proto == "tcp" else f"/{binding.proto}"


def _suggest(b: Binding, allowed: publishing.PortRange) -> int:
    """A host port to advise for `b`: its container port + 8000 (80 -> 8080) when allowed."""
    inside = int(b.port) if b.port.isascii() and b.port.isdigit() else 0
    return inside + 8000 if allowed.covers(inside + 8000, inside + 8000) else allowed.low


def check(found: list[Binding], view: Published, machine: str, *, counted: bool = True) -> Iterator[Finding]:
    """The refusals of `found` under `view`. `counted`: False where the ports are already the repo's
    (a restart of a running container), so the cap and the other repos have nothing to add."""
    if not found:
        return
    allowed = view.policy.ports
    widen = f"rdc machine config {machine} --set publish-ports="
    for b in found:
        where = f"HostConfig.PortBindings {b.key}"
        if b.ephemeral and not allowed.covers(*EPHEMERAL):
            yield refuse(
                RULE,
                b.key,
                f"{where}: any free host port is refused: dockerd picks it from "
                f"{EPHEMERAL[0]}-{EPHEMERAL[1]}, and repos on this machine publish only on host ports "
                f"{allowed}",
                f"a host port in {allowed} (-p {_suggest(b, allowed)}:{b.port}{_proto_suffix(b)})",
            )
        elif not b.ephemeral and not allowed.covers(b.low, b.high):
            asked = str(b.low) if b.low == b.high else f"{b.low}-{b.high}"
            low, high = min(b.low, allowed.low), max(b.high, allowed.high)
            yield refuse(
                RULE,
                asked,
                f"{where}: host port {asked}/{b.proto} is refused: repos on this machine publish only on "
                f"host ports {allowed} (those below 1024 are the host's own services')",
                f"a host port in {allowed} (-p {_suggest(b, allowed)}:{b.port}{_proto_suffix(b)}), "
                f"or the operator's {widen}{low}-{high}",
            )
    if not counted:
        return
    others = view.others()
    for b in found:
        owner = others.get((b.proto, b.low)) if b.low and b.low == b.high else None
        if owner is not None:
            instead = b.low + 1 if b.low < 65535 else b.low - 1
            yield refuse(
                RULE,
                str(b.low),
                f"HostConfig.PortBindings {b.key}: host port {b.low}/{b.proto} is refused: "
                f"repo {view.labels(owner)} publishes it now",
                f"another host port (-p {instead}:{b.port}{_proto_suffix(b)})",
            )
    own = view.own()
    fixed = {(b.proto, b.low) for b in found if b.low and b.low == b.high}
    more = len(fixed - own) + sum(1 for b in found if b.low != b.high or b.ephemeral)
    limit = view.policy.limit
    if len(own) + more > limit:
        yield refuse(
            RULE,
            "publish-limit",
            f"HostConfig.PortBindings: {more} more host port(s) are refused: this repo publishes "
            f"{len(own)} now and may publish at most {limit} (publish-limit)",
            f"fewer ports (-p for those clients need), or the operator's rdc machine config {machine} "
            f"--set publish-limit={len(own) + more}",
        )
