"""A gate in this process in front of a real HTTP server on a Unix socket, for the proxy's tests.

The upstream is the standard library's HTTP server, and the decider a small stand-in with the real
decider's interface, so the tests that use this pin down the proxy alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import shutil
import socket
import socketserver
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import pytest

from rediacc_core.blocking import may_block
from rediacc_core.gate import buildkit
from rediacc_core.gate.audit.log import Audit
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.llb import BuildPolicy
from rediacc_core.gate.decide.decision import Decision, Forward, Refuse
from rediacc_core.gate.policy.endpoints import Resolved, resolve
from rediacc_core.gate.server import GateLimits, GateServer


# --- an upstream that reports what it received ---------------------------------------------------
class Upstream(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    connections = 0
    stream_gate: threading.Event
    grpc_calls = 0  # calls opened on /grpc
    grpc_trailers: list[int]  # the number of fields of each request's trailers

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client the gate let go: expected
            super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Upstream

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") == "chunked":
            out = b""
            while True:
                line = self.rfile.readline()
                if not line:
                    raise ConnectionAbortedError("the gate cut the body off")
                size = int(line.strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/_ping":
            self._send(200, b"OK", "text/plain")
        elif self.path == "/big":
            self._send(200, bytes(range(256)) * (32 * 1024), "application/octet-stream")
        elif self.path == "/stream":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"6\r\nfirst\n\r\n")
            self.wfile.flush()
            self.server.stream_gate.wait(10)  # the client must have seen "first" to get here
            self.wfile.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        else:
            self._send(404, b'{"message":"no such thing"}')

    def do_POST(self) -> None:
        try:
            body = self._body()
        except ConnectionAbortedError:
            self.close_connection = True  # what the gate does with a body it refused halfway
            return
        if self.headers.get("Upgrade") == "tcp":
            self._hijack()
            return
        if self.path.endswith("/grpc") and self.headers.get("Upgrade") == "h2c":
            self._grpc()
            return
        report = {
            "path": self.path,
            "te": self.headers.get("Transfer-Encoding"),
            "cl": self.headers.get("Content-Length"),
            "expect": self.headers.get("Expect"),
            "body": body.decode("latin-1"),
        }
        self._send(200, json.dumps(report).encode())

    def _hijack(self) -> None:
        self.wfile.write(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        self.wfile.flush()
        sock = self.connection
        received = b""
        while True:
            piece = sock.recv(65536)
            if not piece:
                break  # the client half-closed: it is done sending, and still reading
            received += piece
        sock.sendall(received.upper() + b"<eof>")
        sock.shutdown(socket.SHUT_WR)
        self.close_connection = True

    def _grpc(self) -> None:
        """BuildKit's /grpc as the daemon serves it: 101, then HTTP/2; each call is answered with
        grpc-status 0 once its request ended (and counted, with the trailers it brought), after as
        many bytes of data as its `x-answer-bytes` header asks, sent as the windows allow."""
        self.wfile.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
        self.wfile.flush()
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        sock = self.connection
        sock.sendall(conn.data_to_send())
        answer = [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"0")]
        asked: dict[int, int] = {}  # stream -> bytes of data its answer carries
        owed: dict[int, int] = {}  # stream -> bytes of data still to send
        while piece := sock.recv(65536):
            try:
                events = conn.receive_data(piece)
            except h2.exceptions.ProtocolError:
                break
            for event in events:
                if isinstance(event, h2.events.RequestReceived) and event.stream_id:
                    self.server.grpc_calls += 1
                    asked[event.stream_id] = int(dict(event.headers or []).get(b"x-answer-bytes", b"0"))
                elif isinstance(event, h2.events.TrailersReceived):
                    self.server.grpc_trailers.append(len(event.headers or []))
                elif isinstance(event, h2.events.DataReceived) and event.stream_id:
                    conn.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id:
                    with contextlib.suppress(h2.exceptions.ProtocolError):
                        if asked.get(event.stream_id):
                            conn.send_headers(event.stream_id, answer[:2])
                            owed[event.stream_id] = asked[event.stream_id]
                        else:
                            conn.send_headers(event.stream_id, answer, end_stream=True)
            for stream, left in list(owed.items()):
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    while left:
                        room = min(left, conn.local_flow_control_window(stream), conn.max_outbound_frame_size)
                        if room <= 0:
                            break
                        conn.send_data(stream, bytes(room))
                        left -= room
                    owed[stream] = left
                    if not left:
                        del owed[stream]
                        conn.send_headers(stream, answer[2:], end_stream=True)
            sock.sendall(conn.data_to_send())
        self.close_connection = True


# --- a decider stand-in with the real one's interface -------------------------------------------
class StandInDecider:
    """Refuses Privileged; `Slow` stands for a rule that asks the daemon about an image."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def resolve(self, method: str, raw_target: str) -> Resolved:
        return resolve(method, raw_target)

    def inspects(self, request: Resolved) -> bool:
        return request.method == "POST" and request.raw_target.split("?")[0].endswith("/containers/create")

    def remembers(self, request: Resolved) -> bool:
        return True

    def judge_grpc(self, path: str, message: bytes) -> Verdict:
        return buildkit.check(path, message, BuildPolicy())

    def head(self, request: Resolved) -> Decision | None:
        if request.raw_target.split("?")[0].endswith("/swarm/init"):
            return Refuse(403, "swarm mode is refused")
        return None

    def decide_resolved(self, request: Resolved, content_type: str | None, body: bytes) -> Decision:
        doc = json.loads(body) if body else {}
        self.threads.append(threading.current_thread().name)
        if doc.get("Slow"):
            may_block()  # what ImageConfigs does before asking the daemon
            time.sleep(1.5)
        if doc.get("Privileged"):
            return Refuse(403, "privileged containers are refused")
        return Forward(body=json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


# --- fixtures -----------------------------------------------------------------------------------
@dataclass
class Env:
    gate_path: Path
    upstream: Upstream | None
    gate: GateServer
    decider: StandInDecider
    loop: asyncio.AbstractEventLoop

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(self.gate_path))
        return sock

    def on_loop(self, func: Callable[[], Any]) -> Any:
        """`func()` run on the gate's event loop (to read its state between events)."""

        async def call() -> Any:
            return func()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(10)

    def http(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("docker", timeout=10)
        conn.sock = self.connect()
        return conn


def loops() -> list[Any]:
    """asyncio's own loop, and uvloop's when it is installed (the gate prefers it)."""
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


def start_gate(
    gate: GateServer, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = new_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(gate.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    return loop, thread


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))  # Unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=loops())
def new_loop(request: pytest.FixtureRequest) -> Callable[[], asyncio.AbstractEventLoop]:
    factory: Callable[[], asyncio.AbstractEventLoop] = request.param
    return factory


def gate_env(
    short_dir: Path,
    new_loop: Callable[[], asyncio.AbstractEventLoop],
    with_upstream: bool = True,
    *,
    limits: GateLimits | None = None,
    log: Callable[[str], None] | None = None,
    audit: Audit | None = None,
) -> Iterator[Env]:
    upstream = None
    if with_upstream:
        upstream = Upstream(str(short_dir / "up.sock"), Handler)
        upstream.stream_gate = threading.Event()
        upstream.grpc_trailers = []
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
    decider = StandInDecider()
    gate = GateServer(
        short_dir / "gate.sock",
        short_dir / "up.sock",
        decider,
        repo_ref="alpha@m1",
        limits=limits,
        log=log,
        audit=audit,
    )
    loop, thread = start_gate(gate, new_loop)
    yield Env(short_dir / "gate.sock", upstream, gate, decider, loop)
    asyncio.run_coroutine_threadsafe(gate.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    if upstream is not None:
        upstream.shutdown()
        upstream.server_close()


@pytest.fixture
def env(short_dir: Path, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> Iterator[Env]:
    yield from gate_env(short_dir, new_loop)


@pytest.fixture
def env_down(short_dir: Path, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> Iterator[Env]:
    yield from gate_env(short_dir, new_loop, with_upstream=False)


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Exactly one Content-Length response from a raw socket, and not a byte more.

    The head is read a byte at a time and the body to its length, so a response the gate already
    sent behind this one (pipelining) stays in the socket for the next call.
    """
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        piece = sock.recv(1)
        if not piece:
            break
        head += piece
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    body = b""
    while len(body) < length:
        piece = sock.recv(length - len(body))
        if not piece:
            break
        body += piece
    return int(head.split()[1]), body
