"""What the gate does with each kind of answer from the daemon, end to end through real sockets.

The daemon here is scripted: each test says, byte by byte, what it answers, so the paths a real
Docker daemon takes only now and then (1xx heads, bodies read until close, broken framing, a
connection cut mid-answer) are each exercised on purpose. `test_framing.py` pins the framers alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from proxy_kit import StandInDecider, read_response, start_gate

from rediacc_core.blocking import may_block
from rediacc_core.gate.decide.decision import Decision, Refuse
from rediacc_core.gate.policy.endpoints import Resolved, resolve
from rediacc_core.gate.server import DeciderLike, GateServer, new_event_loop

Loop = Callable[[], asyncio.AbstractEventLoop]
Script = Callable[[socket.socket], None]


@dataclass
class Daemon:
    """A Unix-socket server that runs `script` on every connection it accepts."""

    path: Path
    script: Script
    connections: int = 0
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(self.path))
        self.listener.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        try:
            self.script(conn)
        except OSError:
            pass  # the gate let go first: expected in some tests
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            conn.close()

    def close(self) -> None:
        self.listener.close()


def read_request(conn: socket.socket) -> bytes:
    """One request head (and its Content-Length body) as the gate forwarded it."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = conn.recv(65536)
        if not piece:
            return data
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def reset(conn: socket.socket) -> None:
    """Drop the connection with unread bytes in it: the gate sees a reset, not an end of stream."""
    time.sleep(0.05)
    conn.close()


@dataclass
class Setup:
    gate: GateServer
    daemon: Daemon
    logs: list[str]
    loop: asyncio.AbstractEventLoop

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(str(self.gate.listen_path))
        return sock

    def logged(self, text: str) -> bool:
        return any(text in line for line in self.logs)


@pytest.fixture
def serve(short_dir: Path, new_loop: Loop) -> Iterator[Callable[..., Setup]]:
    started: list[tuple[Setup, threading.Thread]] = []

    def start(script: Script, decider: DeciderLike | None = None) -> Setup:
        daemon = Daemon(short_dir / "up.sock", script)
        logs: list[str] = []
        gate = GateServer(
            short_dir / "gate.sock",
            short_dir / "up.sock",
            decider or StandInDecider(),
            repo_ref="alpha@m1",
            log=logs.append,
        )
        loop, thread = start_gate(gate, new_loop)
        setup = Setup(gate, daemon, logs, loop)
        started.append((setup, thread))
        return setup

    yield start
    for setup, thread in started:
        asyncio.run_coroutine_threadsafe(setup.gate.close(), setup.loop).result(10)
        setup.loop.call_soon_threadsafe(setup.loop.stop)
        thread.join(10)
        setup.daemon.close()
        assert not setup.daemon.errors, setup.daemon.errors


def receive_all(sock: socket.socket) -> bytes:
    """Everything the gate sends until it closes the connection."""
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while piece := sock.recv(65536):
            out += piece
    return out


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "condition not reached within 10 s"
        time.sleep(0.02)


PING = b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"


def answer_each(*answers: bytes) -> Script:
    """A daemon that answers each request on a connection with the next of `answers`."""

    def script(conn: socket.socket) -> None:
        for answer in answers:
            if not read_request(conn):
                return
            conn.sendall(answer)
        conn.recv(1)  # hold the connection until the gate lets go

    return script


# --- answers relayed as they are -----------------------------------------------------------------
def test_interim_1xx_heads_reach_the_client_before_the_final_answer(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 102 Processing\r\n\r\n")
        time.sleep(0.05)
        conn.sendall(OK)
        read_request(conn)
        conn.sendall(OK)
        conn.recv(1)

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(PING)
    assert read_response(sock) == (102, b"")
    assert read_response(sock) == (200, b"OK")
    sock.sendall(PING)  # and the connection goes on
    assert read_response(sock) == (200, b"OK")


@pytest.mark.parametrize(
    ("request_line", "answer"),
    [
        (b"HEAD /_ping HTTP/1.1", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"),
        (b"DELETE /containers/x HTTP/1.1", b"HTTP/1.1 204 No Content\r\n\r\n"),
        (b"GET /images/json HTTP/1.1", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n"),
    ],
    ids=["HEAD", "204", "304"],
)
def test_bodiless_answers_end_at_their_head_and_the_connection_goes_on(
    serve: Callable[..., Setup], request_line: bytes, answer: bytes
) -> None:
    setup = serve(answer_each(answer, OK))
    sock = setup.connect()
    sock.sendall(request_line + b"\r\nHost: d\r\n\r\n")
    status = int(answer.split()[1])
    received = b""
    while not received.endswith(b"\r\n\r\n"):
        received += sock.recv(1)
    assert received == answer
    assert int(received.split()[1]) == status
    sock.sendall(PING)
    assert read_response(sock) == (200, b"OK")


def test_a_head_and_its_body_split_across_reads_arrive_whole(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        for piece in (b"HTTP/1.1 200 OK\r\nContent-", b"Length: 5\r\n\r\nab", b"cde"):
            conn.sendall(piece)
            time.sleep(0.02)
        conn.recv(1)

    sock = serve(script).connect()
    sock.sendall(PING)
    assert read_response(sock) == (200, b"abcde")


def test_an_answer_read_until_the_daemon_closes_is_relayed_to_its_end(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n")
        conn.sendall(b"log line 1\n")
        time.sleep(0.02)
        conn.sendall(b"log line 2\n")
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(100) == b"input"  # a hijacked stream: the client's bytes still go through
        conn.recv(1)

    sock = serve(script).connect()
    sock.sendall(b"POST /containers/c1/attach?stream=1 HTTP/1.1\r\nHost: d\r\n\r\n")
    received = b""
    while not received.endswith(b"log line 2\n"):
        received += sock.recv(100)
    assert received.startswith(b"HTTP/1.1 200 OK\r\n")
    sock.sendall(b"input")
    sock.shutdown(socket.SHUT_WR)
    assert receive_all(sock) == b""  # the daemon's end of stream reaches the client


def test_a_tunnel_closes_once_both_sides_have_ended_whichever_ends_first(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\nbye")
        conn.shutdown(socket.SHUT_WR)  # the container's output ends first
        assert conn.recv(100) == b"late stdin"
        assert conn.recv(100) == b""

    sock = serve(script).connect()
    sock.sendall(b"POST /exec/e1/start HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
    assert receive_all(sock).endswith(b"\r\n\r\nbye")
    sock.sendall(b"late stdin")
    sock.shutdown(socket.SHUT_WR)
    assert sock.recv(1) == b""


def test_what_the_client_sent_before_the_switch_goes_through_the_tunnel(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        time.sleep(0.1)  # the client's stdin and its end are in the gate by now
        conn.sendall(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        received = b""
        while piece := conn.recv(100):
            received += piece
        conn.sendall(received.upper())

    sock = serve(script).connect()
    sock.sendall(
        b"POST /exec/e1/start HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n"
        b"Content-Length: 2\r\n\r\n{}early stdin"
    )
    sock.shutdown(socket.SHUT_WR)
    assert receive_all(sock).endswith(b"\r\n\r\nEARLY STDIN")


def test_a_tunnel_the_daemon_drops_is_closed(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
        while conn.recv(100) != b"unread":
            pass
        conn.recv(1)

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(b"POST /exec/e1/start HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 101")
    sock.sendall(b"unread")
    time.sleep(0.05)
    sock.sendall(b"more")  # left unread when the daemon goes: a reset, not an end of stream
    assert receive_all(sock) == b""


def test_an_answer_before_the_whole_body_was_sent_finishes_the_exchange_at_the_bodys_end(
    serve: Callable[..., Setup],
) -> None:
    def script(conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(1)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly")  # before reading the body
        body = b""
        while len(body) < 10:
            body += conn.recv(10 - len(body))
        read_request(conn)
        conn.sendall(OK)
        conn.recv(1)

    sock = serve(script).connect()
    sock.sendall(b"POST /build HTTP/1.1\r\nHost: d\r\nContent-Length: 10\r\n\r\n12345")
    assert read_response(sock) == (200, b"early")
    sock.sendall(b"67890" + PING)
    assert read_response(sock) == (200, b"OK")


def test_a_keep_alive_connection_the_daemon_let_go_is_reopened_for_the_next_request(
    serve: Callable[..., Setup],
) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(OK)
        conn.shutdown(socket.SHUT_WR)  # the daemon's idle timeout
        conn.recv(1)

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(PING)
    assert read_response(sock) == (200, b"OK")
    wait_until(lambda: setup.daemon.connections == 1)
    time.sleep(0.1)
    sock.sendall(PING)
    assert read_response(sock) == (200, b"OK")
    assert setup.daemon.connections == 2


@pytest.mark.parametrize(
    ("answer", "connection"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nOK", b""),
        (OK, b"Connection: close\r\n"),
    ],
    ids=["daemon-closes", "client-closes"],
)
def test_a_connection_either_side_closes_ends_after_the_answer(
    serve: Callable[..., Setup], answer: bytes, connection: bytes
) -> None:
    sock = serve(answer_each(answer)).connect()
    sock.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\n" + connection + b"\r\n")
    assert receive_all(sock) == answer


def test_pipelined_requests_wait_their_turn_and_a_megabyte_behind_pauses_the_client(
    serve: Callable[..., Setup],
) -> None:
    big = 2 * 1024 * 1024

    def script(conn: socket.socket) -> None:
        read_request(conn)
        time.sleep(0.3)  # meanwhile the client sends a pipelined request with a 2 MiB body
        conn.sendall(OK)
        size = str(len(read_request(conn))).encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(size) + size)
        conn.recv(1)

    setup = serve(script)
    sock = setup.connect()
    second = b"PUT /containers/c1/archive HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n" % big
    sender = threading.Thread(target=sock.sendall, args=(PING + second + b"x" * big,))
    sender.start()
    assert read_response(sock) == (200, b"OK")
    status, body = read_response(sock)
    sender.join(10)
    assert status == 200 and int(body) > big


def test_a_thousand_pipelined_refusals_are_answered_in_order(serve: Callable[..., Setup]) -> None:
    sock = serve(answer_each(OK)).connect()
    sock.sendall(b"POST /swarm/init HTTP/1.1\r\nHost: d\r\n\r\n" * 1000 + PING)
    for _ in range(1000):
        assert read_response(sock)[0] == 403
    assert read_response(sock) == (200, b"OK")


# --- answers the gate cannot relay safely ----------------------------------------------------------
def test_a_daemon_body_longer_than_its_content_length_is_cut_and_the_connection_closed(
    serve: Callable[..., Setup],
) -> None:
    setup = serve(answer_each(OK + b"HTTP/1.1 200 OK\r\n\r\nsmuggled"))
    sock = setup.connect()
    sock.sendall(PING)
    assert receive_all(sock) == OK
    assert setup.logged("the daemon sent bytes after a complete response")


def test_bytes_from_the_daemon_with_no_request_outstanding_close_the_connection(
    serve: Callable[..., Setup],
) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(OK)
        time.sleep(0.1)
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\nunasked")
        conn.recv(1)

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(PING)
    assert receive_all(sock) == OK
    assert setup.logged("no request outstanding")


@pytest.mark.parametrize("pause", [0.0, 0.05], ids=["one-write", "bad-line-later"])
def test_a_bad_chunked_answer_closes_the_connection(serve: Callable[..., Setup], pause: float) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        time.sleep(pause)  # however the reads fall, the same bytes reach the client
        conn.sendall(b"zz\r\n")
        conn.recv(1)

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(PING)
    assert receive_all(sock).endswith(b"3\r\nabc\r\n")  # what came before the bad line, not a byte after
    assert setup.logged("bad chunked response from the daemon")


@pytest.mark.parametrize(
    "answer",
    [b"", b"HTTP/1.1 20", b"HTTP/1.1 100 Continue\r\n\r\n"],
    ids=["nothing", "mid-head", "after-interim"],
)
def test_a_daemon_that_closes_before_its_answer_is_a_502_while_nothing_of_it_went_out(
    serve: Callable[..., Setup], answer: bytes
) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(answer)

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(PING)
    received = receive_all(sock)
    if answer.startswith(b"HTTP/1.1 100"):
        assert received == answer  # too late for a 502: the client sees the cut
        assert setup.logged("closed the connection in the middle of a response")
    else:
        assert received.startswith(b"HTTP/1.1 502 ")
        assert b"closed the connection without answering" in received


def test_a_daemon_that_closes_mid_body_cuts_the_answer(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(PING)
    assert receive_all(sock).endswith(b"\r\n\r\nhalf")
    assert setup.logged("closed the connection in the middle of a response")


def test_a_daemon_that_drops_the_connection_unanswered_is_a_502(serve: Callable[..., Setup]) -> None:
    def script(conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            head += conn.recv(1)
        time.sleep(0.1)  # the body is in the socket, unread
        conn.close()

    setup = serve(script)
    sock = setup.connect()
    sock.sendall(b"POST /build HTTP/1.1\r\nHost: d\r\nContent-Length: 5\r\n\r\nabcde")
    received = receive_all(sock)
    assert received.startswith(b"HTTP/1.1 502 ")
    assert b"the connection without answering" in received


@pytest.mark.parametrize(
    "answer",
    [b"HTTP/2 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * (300 * 1024)],
    ids=["garbled", "too-long"],
)
def test_a_daemon_head_the_gate_cannot_read_is_a_502(serve: Callable[..., Setup], answer: bytes) -> None:
    setup = serve(answer_each(answer))
    sock = setup.connect()
    sock.sendall(PING)
    assert receive_all(sock).startswith(b"HTTP/1.1 502 ")


# --- the decider failing or slow ---------------------------------------------------------------
class FailingDecider(StandInDecider):
    """Fails where told to: in `head`/`inspects` (`/fail-route`), or in `decide` (a `Fail` body)."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    def head(self, request: Resolved) -> Decision | None:
        if request.raw_target == "/fail-route":
            raise RuntimeError("route lookup broke")
        return super().head(request)

    def decide_resolved(self, request: Resolved, content_type: str | None, body: bytes) -> Decision:
        if b"Fail" in body:
            if b"Wait" in body:
                may_block()
            raise PermissionError("no")
        if b"Hold" in body:
            may_block()
            self.holding.set()
            self.release.wait(10)
            return Refuse(403, "held and refused", log=("held request refused",))
        return super().decide_resolved(request, content_type, body)


def create(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"POST /containers/create HTTP/1.1\r\nHost: d\r\n"
        + extra
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )


@pytest.mark.parametrize(
    ("request_bytes", "status", "said"),
    [
        (b"POST /fail-route HTTP/1.1\r\nHost: d\r\nContent-Length: 3\r\n\r\nabc", 500, b"route lookup broke"),
        (create(b'{"Fail": 1}'), 500, b"PermissionError: no"),
        (create(b'{"Fail": 1, "Wait": 1}'), 500, b"PermissionError: no"),
    ],
    ids=["route", "inline-decision", "worker-decision"],
)
def test_a_decider_that_fails_is_a_500_and_nothing_is_forwarded(
    serve: Callable[..., Setup], request_bytes: bytes, status: int, said: bytes
) -> None:
    setup = serve(answer_each(OK), FailingDecider())
    sock = setup.connect()
    sock.sendall(request_bytes)
    received = receive_all(sock)
    assert received.startswith(b"HTTP/1.1 %d " % status) and said in received
    assert setup.daemon.connections == 0


def test_a_refusal_on_a_closing_connection_closes_it(serve: Callable[..., Setup]) -> None:
    sock = serve(answer_each(OK)).connect()
    sock.sendall(create(b'{"Privileged": true}', b"Connection: close\r\n"))
    received = receive_all(sock)
    assert received.startswith(b"HTTP/1.1 403 ") and b"Connection: close" in received


def test_a_client_gone_before_its_decision_ends_has_nothing_forwarded(
    serve: Callable[..., Setup],
) -> None:
    decider = FailingDecider()
    setup = serve(answer_each(OK), decider)
    sock = setup.connect()
    sock.sendall(create(b'{"Hold": 1}'))
    assert decider.holding.wait(10)
    sock.close()
    time.sleep(0.1)
    decider.release.set()
    wait_until(lambda: setup.logged("held request refused"))
    assert setup.daemon.connections == 0


def test_a_client_that_ends_its_side_while_its_request_is_decided_gets_the_answer_then_eof(
    serve: Callable[..., Setup],
) -> None:
    decider = FailingDecider()
    setup = serve(answer_each(OK), decider)
    sock = setup.connect()
    sock.sendall(create(b'{"Hold": 1}'))
    assert decider.holding.wait(10)
    sock.shutdown(socket.SHUT_WR)
    time.sleep(0.1)
    decider.release.set()
    received = receive_all(sock)
    assert received.startswith(b"HTTP/1.1 403 ") and b"held and refused" in received


# --- the gate server itself ----------------------------------------------------------------------
def test_a_stale_socket_file_is_replaced_and_a_live_one_is_not(short_dir: Path) -> None:
    async def scenario() -> None:
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(short_dir / "gate.sock"))
        stale.close()  # the file stays, nobody listens: what a crashed gate leaves
        first = GateServer(short_dir / "gate.sock", short_dir / "up.sock", StandInDecider())
        await first.start()
        second = GateServer(short_dir / "gate.sock", short_dir / "up.sock", StandInDecider())
        with pytest.raises(OSError, match="already serving"):
            await second.start()
        await first.close()

    loop = new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()


def test_serve_forever_serves_until_the_gate_is_closed(short_dir: Path) -> None:
    async def scenario() -> None:
        gate = GateServer(short_dir / "gate.sock", short_dir / "up.sock", StandInDecider())
        serving = asyncio.ensure_future(gate.serve_forever())
        while not (short_dir / "gate.sock").exists():
            await asyncio.sleep(0.01)
        await gate.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(serving, 5)
        assert not (short_dir / "gate.sock").exists()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()


def test_the_decider_answers_cache_stays_bounded(short_dir: Path) -> None:
    decider = StandInDecider()
    gate = GateServer(short_dir / "gate.sock", short_dir / "up.sock", decider)
    for n in range(5000):
        assert gate.route("GET", f"/containers/{n}/json") == (None, None)
    assert len(gate._routes) <= 4096
    refused, inspected = gate.route("POST", "/swarm/init")
    assert refused is not None and refused.status == 403 and inspected is None
    assert gate.route("POST", "/containers/create") == (None, resolve("POST", "/containers/create"))
    gate.executor.shutdown()


class CountingDecider(StandInDecider):
    """Counts the request heads it resolves."""

    def __init__(self) -> None:
        super().__init__()
        self.resolved: list[str] = []

    def resolve(self, method: str, raw_target: str) -> Resolved:
        self.resolved.append(f"{method} {raw_target}")
        return super().resolve(method, raw_target)


def test_a_remembered_request_head_is_resolved_once_whether_decided_or_streamed(
    serve: Callable[..., Setup],
) -> None:
    decider = CountingDecider()
    sock = serve(answer_each(OK, OK, OK, OK), decider).connect()
    for _ in range(2):
        sock.sendall(create(b"{}"))
        assert read_response(sock) == (200, b"OK")
        sock.sendall(PING)
        assert read_response(sock) == (200, b"OK")
    # Each head is resolved once, when its answers (not refused; body decided, or streamed) were
    # found, then remembered with them: the second create's decision reads the first's resolution.
    assert decider.resolved == ["POST /containers/create", "GET /_ping"]
