"""A mock stream backend for the gRPC relay: a client and a daemon made of `h2` connections, wired
to a `GrpcRelay` by handing bytes back and forth in memory (no sockets, no event loop)."""

from __future__ import annotations

from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events

from rediacc_core.gate.buildkit.relay import GrpcRelay, Judge
from rediacc_core.gate.wire.protowire import length_field, map_entry


def frame(message: bytes) -> bytes:
    """One gRPC message on the wire."""
    return b"\x00" + len(message).to_bytes(4, "big") + message


def unframe(data: bytes) -> list[bytes]:
    messages = []
    while data:
        size = int.from_bytes(data[1:5], "big")
        messages.append(data[5 : 5 + size])
        data = data[5 + size :]
    return messages


def request_headers(path: str) -> list[tuple[bytes, bytes]]:
    return [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode()),
        (b":authority", b"docker"),
        (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]


@dataclass
class Received:
    """What one side saw of one stream."""

    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    trailers: list[tuple[bytes, bytes]] = field(default_factory=list)
    ended: bool = False
    reset: int | None = None


class Wire:
    """A client, the relay and a daemon; `pump` moves bytes until nothing is left to move."""

    def __init__(self, judge: Judge, *, daemon_window: int = 65535) -> None:
        self.reports: list[tuple[str, int, str, tuple[str, ...]]] = []
        self.relay = GrpcRelay(judge, lambda *report: self.reports.append(report))
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.daemon = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None)
        )
        self.client.initiate_connection()
        self.daemon.initiate_connection()
        self.at_client: dict[int, Received] = {}
        self.at_daemon: dict[int, Received] = {}
        self.daemon_acks = True  # the daemon reads (and acknowledges) what it is sent
        self.pump()

    def pump(self) -> None:
        for _ in range(1000):
            moved = False
            for data, feed in (
                (self.client.data_to_send(), self.relay.client_data),
                (self.daemon.data_to_send(), self.relay.upstream_data),
            ):
                if data:
                    moved = True
                    feed(data)
            to_client, to_daemon = self.relay.for_client(), self.relay.for_upstream()
            if to_client:
                moved = True
                self._events(self.client, self.client.receive_data(to_client), self.at_client)
            if to_daemon:
                moved = True
                self._events(self.daemon, self.daemon.receive_data(to_daemon), self.at_daemon)
            if not moved:
                return
        raise AssertionError("the relay never settled")

    def _events(
        self, conn: h2.connection.H2Connection, events: list[h2.events.Event], seen: dict[int, Received]
    ) -> None:
        for event in events:
            stream = getattr(event, "stream_id", None)
            if not stream:
                continue
            got = seen.setdefault(stream, Received())
            if isinstance(event, (h2.events.RequestReceived, h2.events.ResponseReceived)):
                got.headers = list(event.headers or [])
            elif isinstance(event, h2.events.TrailersReceived):
                got.trailers = list(event.headers or [])
            elif isinstance(event, h2.events.DataReceived):
                got.data += event.data or b""
                if conn is not self.daemon or self.daemon_acks:
                    conn.acknowledge_received_data(event.flow_controlled_length or 0, stream)
            elif isinstance(event, h2.events.StreamEnded):
                got.ended = True
            elif isinstance(event, h2.events.StreamReset):
                got.reset = event.error_code

    def call(self, path: str, *messages: bytes, end: bool = True) -> int:
        """The client opens a call and sends `messages`; returns its stream id."""
        stream = self.client.get_next_available_stream_id()
        self.client.send_headers(stream, request_headers(path))
        for message in messages:
            self.client.send_data(stream, frame(message))
        if end:
            self.client.end_stream(stream)
        self.pump()
        return stream

    def answer(self, stream: int, *messages: bytes, status: int = 0) -> None:
        """The daemon answers `stream` (its own id) with `messages` and a grpc-status."""
        self.daemon.send_headers(stream, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        for message in messages:
            self.daemon.send_data(stream, frame(message))
        self.daemon.send_headers(stream, [(b"grpc-status", str(status).encode())], end_stream=True)
        self.pump()


def solve_request(frontend: str = "", attrs: dict[str, str] | None = None, **fields: bytes) -> bytes:
    """A Control.Solve SolveRequest: `Frontend` (6), `FrontendAttrs` (7) and raw fields by number
    (`f9=...` is field 9)."""
    out = length_field(6, frontend) if frontend else b""
    for name, value in (attrs or {}).items():
        out += map_entry(7, name, value)
    for number, payload in fields.items():
        out += length_field(int(number[1:]), payload)
    return out
