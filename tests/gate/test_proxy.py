"""The gate's proxy: keep-alive, inspected bodies decided off the event loop, streaming, hijacking.

The upstream here is a real HTTP server (the standard library's) on a Unix socket, and the decider
a small stand-in with the real decider's interface, so these tests pin down the proxy alone.
The real daemon and the real decider meet in tests/e2e.
"""

from __future__ import annotations

import asyncio
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

import pytest

from rediacc_core.gate.images import may_block
from rediacc_core.gate.server import INLINE_DECISION_MAX, GateServer


# --- an upstream that reports what it received ---------------------------------------------------
class Upstream(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    connections = 0
    stream_gate: threading.Event

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


# --- a decider stand-in with the real one's interface -------------------------------------------
@dataclass(frozen=True)
class Decision:
    forward: bool
    status: int = 200
    message: str = ""
    body: bytes | None = None
    log: tuple[str, ...] = ()


class StandInDecider:
    """Refuses Privileged; `Slow` stands for a rule that asks the daemon about an image."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def inspects(self, method: str, raw_target: str) -> bool:
        return method == "POST" and raw_target.split("?")[0].endswith("/containers/create")

    def decide(self, method: str, raw_target: str, content_type: str | None, body: bytes) -> Decision:
        doc = json.loads(body) if body else {}
        self.threads.append(threading.current_thread().name)
        if doc.get("Slow"):
            may_block()  # what ImageConfigs does before asking the daemon
            time.sleep(1.5)
        if doc.get("Privileged"):
            return Decision(False, 403, "privileged containers are refused")
        return Decision(True, body=json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


# --- fixtures -----------------------------------------------------------------------------------
@dataclass
class Env:
    gate_path: Path
    upstream: Upstream | None
    gate: GateServer
    decider: StandInDecider

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(self.gate_path))
        return sock

    def http(self) -> http.client.HTTPConnection:
        conn = http.client.HTTPConnection("docker", timeout=10)
        conn.sock = self.connect()
        return conn


def _loops() -> list[Any]:
    """asyncio's own loop, and uvloop's when it is installed (the gate prefers it)."""
    loops: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return loops
    return [*loops, pytest.param(uvloop.new_event_loop, id="uvloop")]


def _start_gate(
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


@pytest.fixture(params=_loops())
def new_loop(request: pytest.FixtureRequest) -> Callable[[], asyncio.AbstractEventLoop]:
    factory: Callable[[], asyncio.AbstractEventLoop] = request.param
    return factory


def _env(
    short_dir: Path, new_loop: Callable[[], asyncio.AbstractEventLoop], with_upstream: bool
) -> Iterator[Env]:
    upstream = None
    if with_upstream:
        upstream = Upstream(str(short_dir / "up.sock"), Handler)
        upstream.stream_gate = threading.Event()
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
    decider = StandInDecider()
    gate = GateServer(short_dir / "gate.sock", short_dir / "up.sock", decider, repo_ref="alpha@m1")
    loop, thread = _start_gate(gate, new_loop)
    yield Env(short_dir / "gate.sock", upstream, gate, decider)
    asyncio.run_coroutine_threadsafe(gate.close(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    if upstream is not None:
        upstream.shutdown()
        upstream.server_close()


@pytest.fixture
def env(short_dir: Path, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> Iterator[Env]:
    yield from _env(short_dir, new_loop, with_upstream=True)


@pytest.fixture
def env_down(short_dir: Path, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> Iterator[Env]:
    yield from _env(short_dir, new_loop, with_upstream=False)


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


# --- the specification ---------------------------------------------------------------------------
def test_keep_alive_requests_share_one_upstream_connection(env: Env) -> None:
    conn = env.http()
    for _ in range(3):
        conn.request("GET", "/_ping")
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, b"OK")
    assert env.upstream is not None and env.upstream.connections == 1


def test_uninspected_chunked_bodies_stream_through_re_framed(env: Env) -> None:
    sock = env.connect()
    sock.sendall(b"POST /images/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc")
    time.sleep(0.05)
    sock.sendall(b"\r\n4\r\ndefg\r\n0\r\n\r\n")
    status, body = read_response(sock)
    report = json.loads(body)
    assert status == 200 and report["body"] == "abcdefg" and report["te"] == "chunked"


def test_inspected_bodies_are_forwarded_canonical_with_a_content_length(env: Env) -> None:
    sock = env.connect()
    payload = b'{"Image": "bb",  "Cmd": ["true"]}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload)
    sock.sendall(
        b"POST /v1.45/containers/create HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunked
    )
    status, body = read_response(sock)
    report = json.loads(body)
    assert status == 200 and report["te"] is None
    assert report["body"] == '{"Cmd":["true"],"Image":"bb"}' and report["cl"] == str(len(report["body"]))


def test_a_refusal_is_a_docker_error_and_the_connection_stays_usable(env: Env) -> None:
    conn = env.http()
    conn.request("POST", "/containers/create", body=b'{"Privileged": true}')
    response = conn.getresponse()
    assert response.status == 403
    assert json.loads(response.read()) == {"message": "privileged containers are refused"}
    conn.request("GET", "/_ping")
    assert conn.getresponse().read() == b"OK"


def test_expect_continue_on_an_inspected_body_is_answered_by_the_gate(env: Env) -> None:
    sock = env.connect()
    sock.sendall(
        b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n"
    )
    assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
    sock.sendall(b"{}")
    status, body = read_response(sock)
    assert status == 200 and json.loads(body)["expect"] is None


def test_oversized_inspected_bodies_are_refused(env: Env) -> None:
    sock = env.connect()
    size = 5 * 1024 * 1024
    sock.sendall(b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n" % size)
    with pytest.raises(OSError):
        sock.sendall(b"{" + b" " * (size - 2) + b"}")  # the gate stops reading and closes
    status, body = read_response(sock)
    assert status == 400 and b"larger than 4 MiB" in body


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n",
        b"Content-Length: 2\r\nContent-Length: 3\r\n",
        b"Transfer-Encoding: chunked, identity\r\n",
        b"X-A: a\r\n b\r\nContent-Length: 2\r\n",
    ],
)
def test_conflicting_framing_is_refused_before_anything_is_forwarded(env: Env, framing: bytes) -> None:
    sock = env.connect()
    sock.sendall(b"POST /images/create HTTP/1.1\r\nHost: d\r\n" + framing + b"\r\n{}")
    status, body = read_response(sock)
    assert status == 400 and b"malformed request" in body
    assert env.upstream is not None and env.upstream.connections == 0


def test_bad_chunk_framing_in_a_streamed_body_is_refused(env: Env) -> None:
    sock = env.connect()
    sock.sendall(
        b"POST /images/create HTTP/1.1\r\nHost: d\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n"
    )
    status, body = read_response(sock)
    assert status == 400 and b"extensions" in body


def test_upstream_down_is_a_502_that_says_what_to_do(env_down: Env) -> None:
    conn = env_down.http()
    conn.request("GET", "/_ping")
    response = conn.getresponse()
    message = json.loads(response.read())["message"]
    assert response.status == 502 and "rdc repo up alpha@m1" in message


def test_a_slow_decision_does_not_stall_other_clients(env: Env) -> None:
    slow = env.http()
    slow.request("POST", "/containers/create", body=b'{"Slow": true}')
    time.sleep(0.1)
    started = time.monotonic()
    fast = env.http()
    fast.request("GET", "/_ping")
    assert fast.getresponse().read() == b"OK"
    assert time.monotonic() - started < 1.0
    assert slow.getresponse().status == 200


def test_chunked_responses_flow_as_they_are_produced(env: Env) -> None:
    assert env.upstream is not None
    sock = env.connect()
    sock.sendall(b"GET /stream HTTP/1.1\r\nHost: d\r\n\r\n")
    seen = b""
    while b"first" not in seen:
        seen += sock.recv(65536)  # arrives although the response is not finished
    env.upstream.stream_gate.set()
    while not seen.endswith(b"0\r\n\r\n"):
        seen += sock.recv(65536)
    assert b"second" in seen


def test_large_responses_arrive_intact(env: Env) -> None:
    conn = env.http()
    conn.request("GET", "/big")
    assert conn.getresponse().read() == bytes(range(256)) * (32 * 1024)


def test_hijacked_streams_carry_each_half_close_through(env: Env) -> None:
    sock = env.connect()
    sock.sendall(
        b"POST /exec/x/start HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101")
    sock.sendall(b"stdin data")
    sock.shutdown(socket.SHUT_WR)  # stdin EOF: the other side must see it, and still answer
    out = b""
    while piece := sock.recv(65536):
        out += piece
    assert out == b"STDIN DATA<eof>"


_PIPELINED = (
    b'POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: 20\r\n\r\n{"Privileged": true}'
    b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n"
)


def test_pipelined_requests_are_answered_in_order(env: Env) -> None:
    sock = env.connect()
    sock.sendall(_PIPELINED)
    time.sleep(0.2)  # both answers are waiting in the socket: reading one must not lose the other
    assert read_response(sock)[0] == 403
    assert read_response(sock) == (200, b"OK")


def test_a_refusal_answers_the_request_pipelined_behind_it_at_every_read_split(env: Env) -> None:
    for split in range(1, len(_PIPELINED)):
        sock = env.connect()
        sock.sendall(_PIPELINED[:split])
        time.sleep(0.002)  # usually a read boundary here; when the kernel joins the two, no harm
        sock.sendall(_PIPELINED[split:])
        assert read_response(sock)[0] == 403, split
        assert read_response(sock) == (200, b"OK"), split
        sock.close()


def test_a_client_that_stops_reading_stalls_only_itself(env: Env) -> None:
    stalled = env.connect()
    stalled.sendall(b"GET /big HTTP/1.1\r\nHost: d\r\n\r\n")  # 8 MiB that nobody reads
    time.sleep(0.3)
    conn = env.http()
    conn.request("GET", "/_ping")
    assert conn.getresponse().read() == b"OK"
    stalled.close()


def test_small_decisions_run_on_the_loop_and_waiting_ones_in_a_worker(env: Env) -> None:
    conn = env.http()
    for body in (b'{"Image": "bb"}', b'{"Slow": true}', b'{"Pad": "' + b"x" * INLINE_DECISION_MAX + b'"}'):
        conn.request("POST", "/containers/create", body=body)
        assert conn.getresponse().read()
    inline, retried, slow, big = env.decider.threads
    assert inline == retried  # the slow one was tried on the loop first ...
    assert slow.startswith("gate-decide") and big.startswith("gate-decide")  # ... then moved
    assert not inline.startswith("gate-decide")
