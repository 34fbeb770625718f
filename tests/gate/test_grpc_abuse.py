"""The HTTP/2 abuse classes of servers, held on the gate's `/grpc` (it ends BuildKit's HTTP/2 itself):
each attack is driven by a raw HTTP/2 client over the real gate's Unix socket, with a daemon that
speaks HTTP/2 behind it, and each is cut off within a bound (`h2limits`) while a plain `/_ping` on
another connection answers all along.

Classes: HPACK dynamic table size churn, too many trailer fields, rapid reset (CVE-2023-44487),
CONTINUATION floods (CVE-2024-27316), HPACK bombs, window-size churn (WINDOW_UPDATE and
SETTINGS_INITIAL_WINDOW_SIZE floods), and PING floods by a client that does not read.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import pytest
from grpc_kit import frame, request_headers
from hpack import Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from proxy_kit import Env

from rediacc_core.gate import buildkit
from rediacc_core.gate.buildkit.h2limits import (
    FRAME_BURST,
    MAX_HEADER_BLOCK,
    MAX_TRAILER_FIELDS,
    PREFACE,
)

LIST_WORKERS = buildkit.CONTROL + "ListWorkers"
UPGRADE = b"POST /grpc HTTP/1.1\r\nHost: docker\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
CALM = h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
# How long a /_ping on another connection may wait while an attack runs, counted in the gate loop's
# own CPU time: the work the loop did before it answered. Wall-clock time would count the host too,
# and on a loaded host a process can wait a second for a core with its loop idle.
PING_BOUND = 1.0
PING_HANG = 10.0  # wall-clock seconds: a /_ping the loop never got to (a stall, not a busy loop)
CPU_BOUND = 2.0  # seconds of the gate's CPU one attack may cost


def _upgraded(env: Env) -> socket.socket:
    sock = env.connect()
    sock.sendall(UPGRADE)
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        piece = sock.recv(1)
        assert piece, f"closed before the 101: {head!r}"
        head += piece
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


@dataclass
class Attacker:
    """A raw HTTP/2 client of the gate's /grpc: frames as written, and everything the gate sends
    read on a thread of its own until the gate closes."""

    sock: socket.socket
    received: bytearray = field(default_factory=bytearray)
    reader: threading.Thread | None = None

    def start(self) -> Attacker:
        self.sock.sendall(PREFACE + SettingsFrame(0).serialize())
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        return self

    def _read(self) -> None:
        with contextlib.suppress(OSError):
            while piece := self.sock.recv(65536):
                self.received += piece

    def send(self, data: bytes) -> bool:
        """Whether the gate still took `data` (False once it closed the connection)."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def flood(self, chunk: Callable[[int], bytes], most: int = 20000) -> int:
        """Send `chunk(i)` for i = 0, 1, ... until the gate closes or `most` went; how many went."""
        for i in range(most):
            if not self.send(chunk(i)):
                return i
        return most

    def closed_with(self, seconds: float = 10.0) -> int | None:
        """The error code of the gate's GOAWAY, once it closed; None if it sent none."""
        assert self.reader is not None
        self.reader.join(seconds)
        assert not self.reader.is_alive(), "the gate kept the connection open"
        self.sock.close()
        return _goaway(bytes(self.received))

    def frames(self) -> list[Frame]:
        return _frames(bytes(self.received))

    def answered(self, stream: int, seconds: float = 10.0) -> bool:
        """Whether the gate answered `stream` (response headers) within `seconds`."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if [f for f in self.frames() if isinstance(f, HeadersFrame) and f.stream_id == stream]:
                return True
            time.sleep(0.01)
        return False


def _frames(data: bytes) -> list[Frame]:
    found, view = [], memoryview(data)
    while len(view) >= 9:
        parsed, length = Frame.parse_frame_header(view[:9])
        if len(view) < 9 + length:
            break
        parsed.parse_body(view[9 : 9 + length])
        found.append(parsed)
        view = view[9 + length :]
    return found


def _goaway(data: bytes) -> int | None:
    codes = [f.error_code for f in _frames(data) if isinstance(f, GoAwayFrame)]
    return codes[0] if codes else None


@dataclass
class Watch:
    """While an attack runs: /_ping on fresh connections, how long each waited (wall-clock and the
    gate loop's CPU), and the gate's CPU time."""

    env: Env
    tid: int
    latencies: list[float] = field(default_factory=list)
    loop_cpu: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    cpu: float = 0.0

    def _ping(self) -> None:
        while not self.stop.is_set():
            began, began_cpu = time.monotonic(), _cpu_seconds(self.tid)
            conn = self.env.http()
            conn.request("GET", "/_ping")
            response = conn.getresponse()
            assert (response.status, response.read()) == (200, b"OK")
            conn.close()
            self.latencies.append(time.monotonic() - began)
            self.loop_cpu.append(_cpu_seconds(self.tid) - began_cpu)
            self.stop.wait(0.02)


def _cpu_seconds(tid: int) -> float:
    """CPU time of thread `tid` of this process, to the nanosecond (the first field of schedstat)."""
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9


@contextlib.contextmanager
def watched(env: Env) -> Iterator[Watch]:
    tid = env.on_loop(threading.get_native_id)
    watch = Watch(env, tid)
    before = _cpu_seconds(tid)
    pinger = threading.Thread(target=watch._ping, daemon=True)
    pinger.start()
    try:
        yield watch
    finally:
        time.sleep(0.1)
        watch.stop.set()
        pinger.join(10)
    watch.cpu = _cpu_seconds(tid) - before
    assert watch.latencies, "no /_ping answered while the attack ran"
    assert max(watch.loop_cpu) < PING_BOUND, sorted(watch.loop_cpu)[-5:]
    assert max(watch.latencies) < PING_HANG, sorted(watch.latencies)[-5:]
    assert watch.cpu < CPU_BOUND, watch.cpu
    assert env.on_loop(lambda: env.gate.buffered) == 0  # nothing held after the connection ended


_encoder = Encoder()


def _block(headers: list[tuple[bytes, bytes]], prefix: bytes = b"") -> bytes:
    """A header block: `prefix` (raw HPACK instructions) and `headers`, encoded without the dynamic table."""
    return prefix + Encoder().encode(headers, huffman=False)


def _headers(stream: int, block: bytes, *flags: str) -> bytes:
    return HeadersFrame(stream, data=block, flags=["END_HEADERS", *flags]).serialize()


# --- HPACK dynamic table size churn -------------------------------------------------------------

SIZE_0, SIZE_4096 = b"\x20", b"\x3f\xe1\x1f"  # dynamic table size updates to 0 and to 4096


def test_a_header_block_with_more_than_two_table_size_updates_ends_the_connection(env: Env) -> None:
    with watched(env):
        client = Attacker(_upgraded(env)).start()
        # Two updates (the smallest size, then the final one) are all RFC 7541 ever needs: served.
        client.send(_headers(1, _block(request_headers(LIST_WORKERS), SIZE_0 + SIZE_4096), "END_STREAM"))
        assert client.answered(1), "the call with two updates was not answered"
        churn = (SIZE_0 + SIZE_4096) * 2000  # 8 KB of evictions and regrowths in one block
        client.send(_headers(3, _block(request_headers(LIST_WORKERS), churn), "END_STREAM"))
        assert client.closed_with() == h2.errors.ErrorCodes.PROTOCOL_ERROR
    assert not [f for f in client.frames() if isinstance(f, HeadersFrame) and f.stream_id == 3]
    assert env.upstream is not None and env.upstream.grpc_calls == 1


# --- too many trailer fields ----------------------------------------------------------------------


def _trailers_call(env: Env, fields: int) -> tuple[str, str]:
    """A forwarded call whose request ends with `fields` trailer fields: its grpc-status and message."""
    sock = _upgraded(env)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(1, request_headers(LIST_WORKERS))
    conn.send_data(1, frame(b""))
    conn.send_headers(1, [(f"x-t{i}".encode(), b"v") for i in range(fields)], end_stream=True)
    sock.sendall(conn.data_to_send())
    found: dict[bytes, bytes] = {}
    sock.settimeout(10)
    while b"grpc-status" not in found:
        piece = sock.recv(65536)
        assert piece, "closed without an answer"
        for event in conn.receive_data(piece):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                found.update(dict(event.headers or []))
        sock.sendall(conn.data_to_send())
    sock.close()
    return found[b"grpc-status"].decode(), urllib.parse.unquote(found.get(b"grpc-message", b"").decode())


def test_trailers_with_too_many_fields_are_refused_and_never_reach_the_daemon(env: Env) -> None:
    assert env.upstream is not None
    with watched(env):
        assert _trailers_call(env, MAX_TRAILER_FIELDS) == ("0", "")
        status, message = _trailers_call(env, MAX_TRAILER_FIELDS + 1)
    assert status == "8"
    assert message == f"rdc gate: {LIST_WORKERS}: more than {MAX_TRAILER_FIELDS} trailer fields"
    assert env.upstream.grpc_trailers == [MAX_TRAILER_FIELDS]


# --- rapid reset (CVE-2023-44487) -----------------------------------------------------------------


def test_rapid_reset_ends_the_connection_and_the_daemon_sees_a_bounded_number_of_calls(env: Env) -> None:
    block = _block(request_headers(LIST_WORKERS))
    with watched(env):
        client = Attacker(_upgraded(env)).start()

        def pair(i: int) -> bytes:
            stream = 2 * i + 1
            return _headers(stream, block) + RstStreamFrame(stream, error_code=8).serialize()

        sent = client.flood(pair)
        assert client.closed_with() == CALM
    assert sent < 20000, "the flood was never cut off"
    assert env.upstream is not None and env.upstream.grpc_calls <= FRAME_BURST / 5


# --- CONTINUATION floods (CVE-2024-27316) ----------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "code"),
    [
        (16384, CALM),  # past MAX_HEADER_BLOCK encoded bytes
        (0, h2.errors.ErrorCodes.PROTOCOL_ERROR),  # past h2's own 64 CONTINUATION frames a block
    ],
    ids=["large", "empty"],
)
def test_a_header_block_that_never_ends_is_cut_off(env: Env, size: int, code: int) -> None:
    with watched(env):
        client = Attacker(_upgraded(env)).start()
        client.send(HeadersFrame(1, data=_block(request_headers(LIST_WORKERS))).serialize())  # no END_HEADERS
        piece = ContinuationFrame(1, data=b"\x00" * size).serialize()
        sent = client.flood(lambda i: piece)
        assert client.closed_with() == code
    if size:
        assert (
            sent * size <= MAX_HEADER_BLOCK + 8 * 1024 * 1024
        )  # the gate's share, the rest in socket buffers
    assert env.upstream is not None and env.upstream.grpc_calls == 0


# --- HPACK bombs ----------------------------------------------------------------------------------


def test_a_small_block_that_decodes_huge_ends_the_connection(env: Env) -> None:
    # One 4000-byte value into the dynamic table (literal with incremental indexing, a new name),
    # then 4000 one-byte references to it: 12 KB encoded, 16 MB decoded.
    value = b"a" * 4000
    insert = b"\x40\x01x" + b"\x7f\xa1\x1e" + value  # name "x", value length 4000 (127 + 3873)
    bomb = _block(request_headers(LIST_WORKERS), insert + b"\xbe" * 4000)
    with watched(env):
        client = Attacker(_upgraded(env)).start()
        client.send(_headers(1, bomb, "END_STREAM"))
        assert client.closed_with() == CALM
    assert env.upstream is not None and env.upstream.grpc_calls == 0


# --- window-size churn ----------------------------------------------------------------------------


def _open_calls(client: Attacker, count: int) -> None:
    """`count` forwarded calls left open (their requests never end), for settings to walk over."""
    block = _block(request_headers(LIST_WORKERS))
    for i in range(count):
        client.send(_headers(2 * i + 1, block) + DataFrame(2 * i + 1, data=frame(b"")).serialize())


def test_a_window_update_flood_ends_the_connection(env: Env) -> None:
    with watched(env):
        client = Attacker(_upgraded(env)).start()
        _open_calls(client, 50)
        sent = client.flood(lambda i: WindowUpdateFrame(1 + 2 * (i % 50), window_increment=1).serialize())
        assert client.closed_with() == CALM
    assert sent < 20000


def test_initial_window_size_churn_ends_the_connection(env: Env) -> None:
    with watched(env):
        client = Attacker(_upgraded(env)).start()
        _open_calls(client, 50)

        def churn(i: int) -> bytes:
            size = 65535 if i % 2 else 1 << 20
            return SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: size}).serialize()

        sent = client.flood(churn)
        assert client.closed_with() == CALM
    assert sent <= FRAME_BURST


def test_a_ping_flood_ends_the_connection(env: Env) -> None:
    with watched(env):
        client = Attacker(_upgraded(env)).start()
        sent = client.flood(lambda i: PingFrame(0, opaque_data=i.to_bytes(8, "big")).serialize())
        assert client.closed_with() == CALM
    assert sent < 20000


def test_a_client_downloading_fast_acknowledges_as_it_reads_and_is_served_to_the_end(env: Env) -> None:
    """Control: a client that sends a WINDOW_UPDATE for its stream and its connection and a PING
    for every DATA frame it reads (Go and gRPC's way, and more) is not taken for a flood: what the
    gate sends it pays for its acknowledgements."""
    size = 48 * 1024 * 1024
    sock = _upgraded(env)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    conn.send_headers(1, [*request_headers(LIST_WORKERS), (b"x-answer-bytes", str(size).encode())])
    conn.send_data(1, frame(b""), end_stream=True)
    sock.sendall(conn.data_to_send())
    sock.settimeout(10)
    got, frames, ended = 0, 0, False
    while not ended:
        piece = sock.recv(1 << 20)
        assert piece, f"closed after {got} bytes"
        for event in conn.receive_data(piece):
            assert not isinstance(event, h2.events.ConnectionTerminated), event
            if isinstance(event, h2.events.DataReceived) and event.data:
                got, frames = got + len(event.data), frames + 1
                with contextlib.suppress(h2.exceptions.StreamClosedError):  # read past its end
                    conn.increment_flow_control_window(len(event.data), 1)
                conn.increment_flow_control_window(len(event.data))
                conn.ping(frames.to_bytes(8, "big"))
            ended = ended or isinstance(event, h2.events.StreamEnded)
        sock.sendall(conn.data_to_send())
    sock.close()
    assert got == size and frames * 3 > 2 * FRAME_BURST  # far more frames than the budget alone holds


def test_a_build_sized_conversation_stays_within_every_bound(env: Env) -> None:
    """Control: a client making calls at a build's pace, with window updates and a few pings, is
    served to the end."""
    sock = _upgraded(env)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    sock.settimeout(10)
    answered = 0
    for round_ in range(300):
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, request_headers(LIST_WORKERS))
        conn.send_data(stream, frame(b""), end_stream=True)
        if round_ % 10 == 0:
            conn.ping(round_.to_bytes(8, "big"))
        sock.sendall(conn.data_to_send())
        while True:
            events = conn.receive_data(sock.recv(65536))
            sock.sendall(conn.data_to_send())
            ended = [e for e in events if isinstance(e, h2.events.StreamEnded) and e.stream_id == stream]
            assert not [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
            if ended:
                answered += 1
                break
    sock.close()
    assert answered == 300
