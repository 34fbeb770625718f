"""The gate's proxy: keep-alive, inspected bodies decided off the event loop, streaming, hijacking.

The upstream here is a real HTTP server (the standard library's) on a Unix socket, and the decider
a small stand-in with the real decider's interface (tests/proxy_kit.py), so these tests pin down the
proxy alone. The real daemon and the real decider meet in tests/e2e.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
from proxy_kit import Env, read_response

from rediacc_core.gate.server import INLINE_DECISION_MAX


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


class _CountingTransport:
    """A client transport that counts the reading stops and restarts asked of it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def pause_reading(self) -> None:
        self.calls.append("pause")
        self.inner.pause_reading()

    def resume_reading(self) -> None:
        self.calls.append("resume")
        self.inner.resume_reading()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _create(body: bytes) -> bytes:
    return b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)


def test_a_decision_on_the_loop_neither_stops_nor_restarts_the_connections_reading(env: Env) -> None:
    """Decided before the loop reads again, a request needs no pause: two epoll changes saved."""
    sock = env.connect()
    sock.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
    assert read_response(sock)[0] == 200

    def wrap() -> _CountingTransport:
        (client,) = env.gate.connections
        counting = _CountingTransport(client.transport)
        client.transport = counting  # type: ignore[assignment]
        return counting

    counting = env.on_loop(wrap)
    for _ in range(3):
        sock.sendall(_create(b'{"Image": "bb"}'))
        assert read_response(sock)[0] == 200
    assert env.decider.threads and not any(t.startswith("gate-decide") for t in env.decider.threads)
    assert counting.calls == []


def test_a_decision_in_a_worker_stops_the_connections_reading_until_it_answers(env: Env) -> None:
    """A pipelined request waits in the socket, unread, while the one before it is decided off the loop."""
    sock = env.connect()
    sock.sendall(_create(b'{"Slow": true}'))
    deadline = time.monotonic() + 5
    while env.on_loop(lambda: [c.reading_stopped for c in env.gate.connections]) != [True]:
        assert time.monotonic() < deadline, "the connection's reading was never stopped"
        time.sleep(0.01)
    sock.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
    assert env.on_loop(lambda: [len(c.exchange.requests.held) for c in env.gate.connections]) == [0]
    assert read_response(sock)[0] == 200  # the create, forwarded
    assert read_response(sock) == (200, b"OK")  # then the ping, read once reading went on
    assert env.on_loop(lambda: [c.reading_stopped for c in env.gate.connections]) == [False]


def test_a_request_refused_from_its_head_is_answered_after_its_body_on_a_live_connection(env: Env) -> None:
    """A client writing a body (a build context) before reading must see the refusal, not a broken pipe."""
    conn = env.http()
    body = b"x" * (3 * 1024 * 1024)
    conn.request("POST", "/v1.45/swarm/init", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 403 and b"swarm mode is refused" in response.read()
    conn.request("GET", "/_ping")  # the same connection goes on
    assert conn.getresponse().status == 200
