"""Published ports: a container's `-p` reaches the host through the repo's uplink only, on the
addresses the machine allows (setting `publish-addresses`, default 127.0.0.1).

Inside the repo's namespace dockerd publishes as usual (its DNAT rules catch what arrives for the
namespace's own address). Nothing outside the namespace reaches that, except what slirp4netns
forwards: this keeper, one process per repo beside the uplink, follows the daemon's container events
and keeps slirp4netns's forwards (its API socket's `add_hostfwd`/`remove_hostfwd`) equal to the
ports the repo's running containers publish on all of the namespace's addresses (`-p 8080:80`),
on each allowed host address. A port published on one address inside (`-p 127.0.0.1:8080:80`)
stays inside: the operator, not the tenant, chooses the host's addresses.

    python -m rediacc_core.runtime.ports --root R --daemon SOCK --api SOCK --netns NAME

`netns.bring_up` starts it. With `--netns` it also runs the namespace's `uplinkwatch` thread (the
uplink rules follow the host).

The decisions (`wanted`, `plan`) are pure and tested without a daemon.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rediacc_core import unixhttp
from rediacc_core.runtime import netns, uplinkwatch

GUEST_ADDRESS = "10.0.2.100"  # the namespace's uplink address (slirp4netns --configure)
_ANY = frozenset({"", "0.0.0.0", "::"})
_EVENTS = '/events?filters={"type":["container"]}'
RETRY = 1.0  # seconds between attempts while the daemon is not (yet, or any more) answering


@dataclass(frozen=True, order=True)
class Forward:
    """One slirp4netns forward: host_addr:host_port on the host to the namespace's same port."""

    proto: str
    host_addr: str
    host_port: int


def wanted(listing: Iterable[Mapping[str, Any]], allowed: Sequence[str]) -> set[Forward]:
    """The forwards the running containers of `listing` (`GET /containers/json`) call for."""
    found: set[Forward] = set()
    for container in listing:
        if container.get("State", "running") != "running":
            continue
        for port in container.get("Ports") or ():
            public, proto = port.get("PublicPort"), str(port.get("Type", "tcp"))
            if not public or proto not in ("tcp", "udp") or str(port.get("IP", "")) not in _ANY:
                continue
            found.update(Forward(proto, address, int(public)) for address in allowed)
    return found


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
    entries = call(api, {"execute": "list_hostfwd"}).get("return", {}).get("entries", [])
    return {Forward(e["proto"], e["host_addr"], int(e["host_port"])): int(e["id"]) for e in entries}


def reconcile(daemon: Path, api: Path, allowed: Sequence[str], log: Any = print) -> None:
    status, raw = unixhttp.request(daemon, "GET", "/containers/json")
    if status != 200:
        raise OSError(f"the daemon answered {status} to a container listing")
    add, remove = plan(current_forwards(api), wanted(json.loads(raw), allowed))
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
            log(f"published {fwd.proto} {fwd.host_addr}:{fwd.host_port}")
    if remove:
        log(f"withdrew {len(remove)} published port(s)")


def allowed_addresses(root: Path) -> list[str]:
    """The machine's `publish-addresses`, read at every round (a change applies at the next event)."""
    from rediacc_core.machine import Machine
    from rediacc_core.settings import effective, read_settings, split_list

    try:
        value = effective(read_settings(Machine(name="local", root=root)))["publish-addresses"]
    except Exception:  # unreadable settings: publish nowhere (failing closed), say so
        print("settings unreadable: publishing no port", flush=True)
        return []
    return [a for a in split_list(value) if a != "none"]


def follow(root: Path, daemon: Path, api: Path) -> None:
    """Reconcile at start and after every container event, for as long as the process lives."""
    said = ""  # the last wait's reason: said once, not every second while the daemon is down
    while True:
        try:
            reconcile(daemon, api, allowed_addresses(root), lambda line: print(line, flush=True))
            conn = unixhttp.UnixHTTPConnection(daemon, timeout=None)  # events come when they come
            conn.request("GET", _EVENTS)
            response = conn.getresponse()
            said = ""
            while line := response.readline():
                if line.strip():
                    reconcile(daemon, api, allowed_addresses(root), lambda line: print(line, flush=True))
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
    parser.add_argument("--netns", help="the repo's network namespace, whose uplink rules follow the host")
    args = parser.parse_args(argv)
    if args.netns:  # a thread of this process, so it starts and stops with the keeper
        uplinkwatch.start(
            netns.RepoNetwork(args.netns, args.api.parent), lambda line: print(line, flush=True)
        )
    with contextlib.suppress(KeyboardInterrupt):
        follow(args.root, args.daemon, args.api)
    return 0


if __name__ == "__main__":
    sys.exit(main())
