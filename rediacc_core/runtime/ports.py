"""Published ports: a container's `-p` reaches the host through the repo's uplink only, on the
addresses the machine allows (setting `publish-addresses`, default 127.0.0.1).

Inside the repo's namespace dockerd publishes as usual (its DNAT rules catch what arrives for the
namespace's own address). Nothing outside the namespace reaches that, except what slirp4netns
forwards: this keeper, one process per repo beside the uplink, follows the daemon's container events
and keeps slirp4netns's forwards (its API socket's `add_hostfwd`/`remove_hostfwd`) equal to the
ports the repo's running containers publish on all of the namespace's addresses (`-p 8080:80`),
on each allowed host address. A port published on one address inside (`-p 127.0.0.1:8080:80`)
stays inside: the operator, not the tenant, chooses the host's addresses.

The keeper holds the machine's publishing policy too (`rediacc_core.publishing`: `publish-ports`,
`publish-limit`), whatever the gate saw: a container created before a change, or started by the
daemon's restart policy, gets no port outside it. Ports it forwards already keep their place under
the limit, then the oldest containers' come first; what it skips, it says once in its log. It writes
what it publishes to its state file, where the gates of the machine's repos read it.

    python -m rediacc_core.runtime.ports --root R --daemon SOCK --api SOCK --state FILE --netns NAME

`netns.bring_up` starts it. With `--netns` it also runs the namespace's `uplinkwatch` thread (the
uplink rules follow the host).

The decisions (`published_ports`, `admit`, `wanted`, `plan`) are pure and tested without a daemon.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import signal
import socket
import sys
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rediacc_core import unixhttp
from rediacc_core.machine import Machine
from rediacc_core.publishing import ANY_ADDRESS, PROTOCOLS, Policy, Port, policy_from, write_state
from rediacc_core.runtime import netns, uplinkwatch
from rediacc_core.runtime.layout import RepoNetwork
from rediacc_core.settings import effective, read_settings
from rediacc_core.values import split_list

GUEST_ADDRESS = netns.UPLINK_ADDRESS
DEFAULT_POLICY = policy_from({})
_EVENTS = '/events?filters={"type":["container"]}'
RETRY = 1.0  # seconds between attempts while the daemon is not (yet, or any more) answering


@dataclass(frozen=True, order=True)
class Forward:
    """One slirp4netns forward: host_addr:host_port on the host to the namespace's same port."""

    proto: str
    host_addr: str
    host_port: int


def published_ports(listing: Iterable[Mapping[str, Any]]) -> list[Port]:
    """The host ports the running containers of `listing` (`GET /containers/json`) publish on every
    address, once each, the oldest container's first."""
    found: dict[Port, None] = {}
    running = [c for c in listing if c.get("State", "running") == "running"]
    for container in sorted(running, key=lambda c: int(c.get("Created") or 0)):
        for port in container.get("Ports") or ():
            public, proto = port.get("PublicPort"), str(port.get("Type", "tcp"))
            if public and proto in PROTOCOLS and str(port.get("IP", "")) in ANY_ADDRESS:
                found[(proto, int(public))] = None
    return list(found)


def admit(ports: Sequence[Port], policy: Policy, keep: Collection[Port] = ()) -> tuple[list[Port], list[str]]:
    """(the ports to publish, why each other one is not): those in `policy`'s range, those already
    forwarded (`keep`) first, then in order, up to its limit."""
    skipped = [
        f"port {p} {n} not published: outside this machine's publish-ports {policy.ports}"
        for p, n in ports
        if not policy.ports.covers(n, n)
    ]
    inside = [port for port in ports if policy.ports.covers(port[1], port[1])]
    ordered = [port for port in inside if port in keep] + [port for port in inside if port not in keep]
    skipped += [
        f"port {p} {n} not published: the repo publishes {policy.limit} ports, this machine's publish-limit"
        for p, n in ordered[policy.limit :]
    ]
    return ordered[: policy.limit], skipped


def wanted(
    listing: Iterable[Mapping[str, Any]], allowed: Sequence[str], policy: Policy = DEFAULT_POLICY
) -> set[Forward]:
    """The forwards the running containers of `listing` call for, under `policy`."""
    ports, _ = admit(published_ports(listing), policy)
    return {Forward(proto, address, port) for proto, port in ports for address in allowed}


def plan(current: Mapping[Forward, int], want: set[Forward]) -> tuple[list[Forward], list[int]]:
    """(forwards to add, slirp4netns ids to remove) to go from `current` to `want`."""
    return sorted(want - current.keys()), sorted(i for f, i in current.items() if f not in want)


def call(api: Path, request: Mapping[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """One request to slirp4netns's API socket (it answers one JSON object, then closes)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(api))
        sock.sendall(json.dumps(request).encode())
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    answer: dict[str, Any] = json.loads(data or b"{}")
    return answer


def current_forwards(api: Path) -> dict[Forward, int]:
    answer = call(api, {"execute": "list_hostfwd"})
    # slirp4netns answers `{"entries": [...]}`, not under "return" as its other commands do.
    entries = answer.get("entries", answer.get("return", {}).get("entries", []))
    return {Forward(e["proto"], e["host_addr"], int(e["host_port"])): int(e["id"]) for e in entries}


@dataclass
class Keeping:
    """What one keeper carries from round to round."""

    state: Path | None = None  # its state file (`publishing.state_file`)
    skipped: frozenset[str] = frozenset()  # the skips last said, so each is said once while it lasts


def reconcile(
    daemon: Path,
    api: Path,
    allowed: Sequence[str],
    log: Any = print,
    policy: Policy = DEFAULT_POLICY,
    keeping: Keeping | None = None,
) -> None:
    keeping = keeping or Keeping()
    status, raw = unixhttp.request(daemon, "GET", "/containers/json")
    if status != 200:
        raise OSError(f"the daemon answered {status} to a container listing")
    current = current_forwards(api)
    ports, skipped = admit(
        published_ports(json.loads(raw)), policy, {(f.proto, f.host_port) for f in current}
    )
    for line in skipped:
        if line not in keeping.skipped:
            log(line)
    keeping.skipped = frozenset(skipped)
    add, remove = plan(current, {Forward(p, address, n) for p, n in ports for address in allowed})
    published = {(f.proto, f.host_port) for f, ident in current.items() if ident not in remove}
    for ident in remove:
        call(api, {"execute": "remove_hostfwd", "arguments": {"id": ident}})
    for fwd in add:
        arguments = {
            "proto": fwd.proto,
            "host_addr": fwd.host_addr,
            "host_port": fwd.host_port,
            "guest_addr": GUEST_ADDRESS,
            "guest_port": fwd.host_port,
        }
        answer = call(api, {"execute": "add_hostfwd", "arguments": arguments})
        if "error" in answer:  # in use on the host (another repo, a host service): said, not fatal
            log(f"port {fwd.proto} {fwd.host_addr}:{fwd.host_port} not published: {answer['error']}")
        else:
            published.add((fwd.proto, fwd.host_port))
            log(f"published {fwd.proto} {fwd.host_addr}:{fwd.host_port}")
    if remove:
        log(f"withdrew {len(remove)} published port(s)")
    if keeping.state is not None:
        write_state(keeping.state, published)


def machine_policy(root: Path) -> tuple[list[str], Policy]:
    """The machine's `publish-addresses` and publishing policy, read at every round (a change
    applies at the next event)."""
    try:
        settings = effective(read_settings(Machine(name="local", root=root)))
    except Exception:  # unreadable settings: publish nowhere (failing closed), say so
        print("settings unreadable: publishing no port", flush=True)
        return [], DEFAULT_POLICY
    return [a for a in split_list(settings["publish-addresses"]) if a != "none"], policy_from(settings)


def _say(line: str) -> None:
    print(line, flush=True)


def follow(root: Path, daemon: Path, api: Path, state: Path | None = None) -> None:
    """Reconcile at start and after every container event, for as long as the process lives."""
    said = ""  # the last wait's reason: said once, not every second while the daemon is down
    keeping = Keeping(state)

    def round_() -> None:
        addresses, policy = machine_policy(root)
        reconcile(daemon, api, addresses, _say, policy, keeping)

    while True:
        try:
            round_()
            conn = unixhttp.UnixHTTPConnection(daemon, timeout=None)  # events come when they come
            conn.request("GET", _EVENTS)
            response = conn.getresponse()
            said = ""
            while line := response.readline():
                if line.strip():
                    round_()
            conn.close()
        except (OSError, ValueError, http.client.HTTPException) as exc:
            if str(exc) != said:
                said = str(exc)
                print(f"waiting for the daemon: {exc}", flush=True)
        except Exception as exc:  # an answer of a shape not foreseen: say it, keep keeping
            print(f"port keeping failed: {type(exc).__name__}: {exc}", flush=True)
        time.sleep(RETRY)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rediacc_core.runtime.ports", description=__doc__)
    parser.add_argument("--root", required=True, type=Path, help="the machine's filesystem root")
    parser.add_argument("--daemon", required=True, type=Path, help="the repo daemon's socket")
    parser.add_argument("--api", required=True, type=Path, help="slirp4netns's API socket")
    parser.add_argument("--state", type=Path, help="where to write the ports it publishes")
    parser.add_argument("--netns", help="the repo's network namespace, whose uplink rules follow the host")
    args = parser.parse_args(argv)
    if args.netns:  # a thread of this process, so it starts and stops with the keeper
        uplinkwatch.start(RepoNetwork(args.netns, args.api.parent), lambda line: print(line, flush=True))
    # `repo down` sends SIGTERM: the state file goes first, so no gate counts what is withdrawn.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            follow(args.root, args.daemon, args.api, args.state)
    finally:
        if args.state is not None:
            args.state.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
