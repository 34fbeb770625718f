"""The gate's Python per exchange, in this process: `python bench/exchange_cost.py [exchanges]`.

A real `GateServer` and `_Client` (and `Decider`, on the simulated machine `tests/gate/bench_decide.py`
sets up) with transports that keep nothing: each exchange is a request head handed to the client
side as one read and a whole response handed to the daemon side as one read, as on a keep-alive
connection. It times what Python does per exchange, without the system calls and the wake-ups the
benchmark's `proxy CPU per request` also counts; `--profile` prints cProfile's top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import tempfile
import time
from pathlib import Path
from typing import Any

from rediacc_core.gate.decide.decider import Decider
from rediacc_core.gate.server import GateServer, _Client, _Upstream
from rediacc_core.machine import Machine
from rediacc_core.plugins import load_plugins
from rediacc_core.repos import Repo

DATA = Path(__file__).parent.parent / "tests" / "gate" / "data" / "docker-cli-requests.jsonl"
PING = b"GET /_ping HTTP/1.1\r\nHost: api.moby.localhost\r\nUser-Agent: Docker-Client/28.2.2 (linux)\r\n\r\n"
PONG = (
    b"HTTP/1.1 200 OK\r\nApi-Version: 1.45\r\nCache-Control: no-cache, no-store, must-revalidate\r\n"
    b"Content-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\nDate: Sun, 06 Dec 2026 05:00:00 GMT\r\n"
    b"Docker-Experimental: false\r\nOstype: linux\r\nPragma: no-cache\r\n"
    b"Server: Docker/26.1.5 (linux)\r\n\r\nOK"
)
TAKEN = (
    b"HTTP/1.1 409 Conflict\r\nApi-Version: 1.45\r\nContent-Length: 20\r\nContent-Type: application/json\r\n"
    b"Date: Sun, 06 Dec 2026 05:00:00 GMT\r\nServer: Docker/26.1.5 (linux)\r\n\r\n"
    b'{"message":"taken"}\n'
)


class _Sink:
    """A transport that takes everything and sends nothing."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: Any) -> None:
        self.written += 1

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str) -> Any:
        return None


def _gate() -> GateServer:
    request = json.loads(DATA.read_text().splitlines()[0])
    names = tuple(json.loads(request["body"])["HostConfig"]["DeviceRequests"][0]["DeviceIDs"])
    root = Path(tempfile.mkdtemp())
    (root / "mnt" / "data").mkdir(parents=True)
    machine = Machine("bench", root)
    repo = Repo("bench-id", "bench", None, "bench", None, "2026-01-01T00:00:00Z")
    grants = frozenset(names)
    plugins = load_plugins()
    decider = Decider(machine, repo, plugins, lambda image: None, lambda line: None, grants=lambda r: grants)
    return GateServer(root / "gate.sock", root / "docker.sock", decider)


def _client(gate: GateServer) -> _Client:
    client = _Client(gate)
    client.connection_made(_Sink())  # type: ignore[arg-type]
    upstream = _Upstream(client)
    upstream.connection_made(_Sink())  # type: ignore[arg-type]
    client.upstream = upstream
    client.exchange.upstream = "open"
    return client


def _one(client: _Client, request: bytes, response: bytes) -> None:
    buf = client.gate.read_buffer
    client.get_buffer(-1)
    buf[: len(request)] = request
    client.buffer_updated(len(request))
    up = client.upstream
    assert up is not None
    up.get_buffer(-1)
    buf[: len(response)] = response
    up.buffer_updated(len(response))


def measure(exchanges: int, profile: bool) -> None:
    loop = asyncio.new_event_loop()  # the admitted-log timer and the gate expect a running loop's calls
    asyncio.set_event_loop(loop)
    gate = _gate()
    request = json.loads(DATA.read_text().splitlines()[0])
    body = request["body"].encode()
    create = (
        f"POST {request['target']} HTTP/1.1\r\nHost: api.moby.localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    cases = {
        "GET /_ping": (PING, PONG, exchanges),
        "POST create (409)": (create, TAKEN, max(1, exchanges // 20)),
    }
    for name, (req, resp, count) in cases.items():
        client = _client(gate)
        for _ in range(200):
            _one(client, req, resp)
        assert client.exchange.phase == "idle", client.exchange.phase
        runs = []
        for _ in range(5):
            start = time.thread_time_ns()
            for _ in range(count):
                _one(client, req, resp)
            runs.append((time.thread_time_ns() - start) / count / 1000)
        print(f"{name}: {min(runs):.2f} µs of Python per exchange (best of 5 x {count})")
        if profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(count):
                _one(client, req, resp)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exchanges", type=int, nargs="?", default=20000)
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions")
    args = parser.parse_args()
    measure(args.exchanges, args.profile)


if __name__ == "__main__":
    main()
