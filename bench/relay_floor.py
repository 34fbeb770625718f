"""The floor of a Python proxy here: relays bytes both ways on uvloop, and parses nothing.

Run in the gate's place to see what no amount of work on the gate's HTTP handling can beat on
this machine (a proxy must at least read and write every byte, in Python callbacks):

    RDC_BENCH_GATE_CMD='{python} bench/relay_floor.py --listen {listen} --upstream {upstream}' \\
        python bench/run.py --only rate --rounds 2

It refuses nothing and must never stand in front of a real daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class _Client(asyncio.Protocol):
    def __init__(self, upstream_path: str) -> None:
        self.upstream_path = upstream_path
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.held: list[bytes] = []  # read while the upstream connection is being made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_unix_connection(lambda: _Upstream(self), self.upstream_path)
        self.upstream = upstream
        for data in self.held:
            self._send_up(data)
        self.held = []

    def _send_up(self, data: bytes) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.held.append(data)
        else:
            self._send_up(data)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


async def _serve(listen: str, upstream: str) -> None:
    if os.path.exists(listen):
        os.unlink(listen)
    server = await asyncio.get_running_loop().create_unix_server(lambda: _Client(upstream), listen)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvloop.run(_serve(args.listen, args.upstream))


if __name__ == "__main__":
    main()
