"""BuildKit's gRPC connection (`POST /grpc`, after the daemon's 101) relayed call by call: bytes
in, bytes out, no sockets (the asyncio side is `server._Client`).

The gate ends the client's HTTP/2 connection (it is the server there) and holds its own to the
daemon (it is the client there), both with the `h2` library, which is sans-IO. Each gRPC call the
client opens becomes a call on the daemon's connection, its headers, messages and trailers
relayed both ways. A call's method decides what happens (`buildkit.METHODS`):

- `forward`: its bytes are relayed as they come. Flow control is per side: data read on one side
  is acknowledged there only once it went out on the other, so a slow reader slows its writer
  and the gate holds at most one flow-control window per direction and connection.
- `check`: each request message is read whole (up to `MAX_MESSAGE`, acknowledged as it arrives
  and counted in `held`, which the gate's buffer limit covers) and judged before anything of it
  goes on; the call is opened on the daemon's side only once its first message passed. A refused
  call is answered by the gate itself with grpc-status 7 (PERMISSION_DENIED) and a message naming
  the field and what to use instead, which the docker CLI prints; the daemon never sees it, or
  sees it cancelled when an earlier message of the same stream had passed.
- a method the table lacks: refused the same way.

Compressed messages on checked calls are refused (BuildKit's clients send none): the gate would
judge bytes the daemon reads differently.

The client's side is held to `h2limits`: its frames are metered before `h2` reads them, its header
blocks bounded, encoded and decoded; a client past a bound gets GOAWAY ENHANCE_YOUR_CALM (or
COMPRESSION_ERROR) and the connection ends on both sides.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from rediacc_core.gate import buildkit
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.h2limits import (
    MAX_HEADER_LIST,
    Abuse,
    BoundedDecoder,
    FrameMeter,
    too_many_fields,
)

MAX_MESSAGE = 16 * 1024 * 1024  # BuildKit's own limit on a received message
WINDOW = 1024 * 1024  # each side's flow-control window, per stream and per connection
PERMISSION_DENIED = 7
RESOURCE_EXHAUSTED = 8
INVALID_ARGUMENT = 3
_PREFIX = 5  # a gRPC message: a compressed flag, a 4-byte length, the message

Headers = list[tuple[bytes, bytes]]
Judge = Callable[[str, bytes], Verdict]
# What became of a checked call: its path, grpc-status (0: admitted), the message or the gate's
# notes, and the refusing rules' ids (for the log and the audit trail).
Report = Callable[[str, int, str, tuple[str, ...]], None]


@dataclass
class _Call:
    """One gRPC call: its ids on both sides and what is waiting to go out on each."""

    client_id: int
    path: str
    checked: bool
    headers: Headers
    upstream_id: int | None = None
    inbound: bytearray = field(default_factory=bytearray)  # a checked call's unfinished message
    to_upstream: deque[tuple[str, bytes | Headers, int]] = field(default_factory=deque)
    to_client: deque[tuple[str, bytes | Headers, int]] = field(default_factory=deque)
    responded: bool = False  # response headers went to the client
    refused: bool = False
    client_ended: bool = False
    response_ended: bool = False  # the daemon's end of the response is queued for the client


def grpc_message(text: str) -> bytes:
    """`text` percent-encoded as the grpc-message header requires."""
    out = bytearray()
    for byte in text.encode("utf-8"):
        out += b"%%%02X" % byte if byte < 0x20 or byte > 0x7E or byte == 0x25 else bytes([byte])
    return bytes(out)


def _connection(client_side: bool) -> h2.connection.H2Connection:
    """One side's HTTP/2 connection, its preface queued: windows of `WINDOW`; toward the daemon no
    push, toward the client `h2limits`' decoder and header list size."""
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=client_side, header_encoding=None)
    )
    settings = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW}
    if client_side:
        settings[h2.settings.SettingCodes.ENABLE_PUSH] = 0
    else:
        settings[h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE] = MAX_HEADER_LIST
        conn.decoder = BoundedDecoder()
    conn.local_settings = h2.settings.Settings(client=client_side, initial_values=settings)
    conn.initiate_connection()
    conn.increment_flow_control_window(WINDOW - 65535)
    return conn


def _refusal(verdict: Verdict) -> tuple[str, tuple[str, ...]]:
    """The grpc-message of a refused verdict, and its rules' ids."""
    text = "\n".join(
        f"{f.refusal.message}; use instead: {f.refusal.replacement}"
        if f.refusal.replacement
        else f.refusal.message
        for f in verdict.findings
    )
    return f"rdc gate: {text}", tuple(
        dict.fromkeys(f.refusal.rule for f in verdict.findings if f.refusal.rule)
    )


class GrpcRelay:
    """The relay of one `/grpc` connection. Feed it with `client_data` / `upstream_data`; send what
    `for_client` / `for_upstream` return; close both sides once `closed` is true and that is sent."""

    def __init__(self, judge: Judge, report: Report | None = None) -> None:
        self.judge = judge
        self.report: Report = report or (lambda path, status, message, rules: None)
        self.client, self.upstream = _connection(False), _connection(True)
        self.meter = FrameMeter()
        self.calls: dict[int, _Call] = {}  # by client stream id
        self.by_upstream: dict[int, _Call] = {}
        self.held = 0  # bytes of checked messages read and not yet judged
        self.closed = False

    # --- bytes in -------------------------------------------------------------------------------
    def client_data(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.meter.feed(data)  # first: a flood is cut off before h2 parses any of it
            events = self.client.receive_data(data)
        except Abuse as exc:  # past a bound of h2limits: GOAWAY, then both sides close
            self.report("/grpc", RESOURCE_EXHAUSTED, f"rdc gate: HTTP/2 connection ended: {exc}", ("limit",))
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.client.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, str(exc).encode())
            self._close()
            return
        except h2.exceptions.ProtocolError:
            self._close()
            return
        for event in events:
            self._client_event(event)
        self._flush()

    def upstream_data(self, data: bytes) -> None:
        try:
            events = self.upstream.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._close()
            return
        for event in events:
            self._upstream_event(event)
        self._flush()

    def client_eof(self) -> None:
        self._close()

    def upstream_eof(self) -> None:
        self._close()

    # --- bytes out ------------------------------------------------------------------------------
    def for_client(self) -> bytes:
        return self.meter.credited(self.client.data_to_send())

    def for_upstream(self) -> bytes:
        return self.upstream.data_to_send()

    # --- the client's side ----------------------------------------------------------------------
    def _client_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._request(event.stream_id, list(event.headers or []))
        elif isinstance(event, h2.events.DataReceived):
            self._request_data(event.stream_id, event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.TrailersReceived):
            call = self.calls.get(event.stream_id or 0)
            if call is not None and not call.refused:
                call.client_ended = True  # trailers end the request: its StreamEnded adds nothing
                trailers = list(event.headers or [])
                over = too_many_fields(call.path, len(trailers), trailers=True)
                if over:
                    self._refuse(call, RESOURCE_EXHAUSTED, over, ("limit",))
                else:
                    call.to_upstream.append(("trailers", trailers, 0))
        elif isinstance(event, h2.events.StreamEnded):
            self._request_ended(event.stream_id or 0)
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.pop(event.stream_id or 0, None)
            if call is not None:
                self._forget(call)
                if call.upstream_id is not None:
                    _reset(self.upstream, call.upstream_id)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._close()

    def _request(self, stream_id: int, headers: Headers) -> None:
        path = dict(headers).get(b":path", b"").decode("latin-1")
        action = buildkit.action(path)
        call = _Call(stream_id, path, action == "check", headers)
        self.calls[stream_id] = call
        over = too_many_fields(path, len(headers), trailers=False)
        if over:
            self._refuse(call, RESOURCE_EXHAUSTED, over, ("limit",))
        elif action is None:
            why = f"rdc gate: {path} is not a BuildKit call the gate knows, so it is refused"
            self._refuse(call, PERMISSION_DENIED, why, ("endpoint",))
        elif action == "forward":
            self._open_upstream(call)

    def _request_data(self, stream_id: int, data: bytes, flow: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.refused:
            _ack(self.client, stream_id, flow)
            return
        if not call.checked:
            call.to_upstream.append(("data", data, flow))
            return
        _ack(self.client, stream_id, flow)  # held and counted instead: a message may span windows
        call.inbound += data
        self.held += len(data)
        while not call.refused and len(call.inbound) >= _PREFIX:
            compressed = call.inbound[0]
            size = int.from_bytes(call.inbound[1:_PREFIX], "big")
            if size > MAX_MESSAGE:
                too_big = f"rdc gate: {call.path}: a request message over {MAX_MESSAGE} bytes"
                self._refuse(call, RESOURCE_EXHAUSTED, too_big, ("limit",))
                return
            if len(call.inbound) < _PREFIX + size:
                return
            message = bytes(call.inbound[_PREFIX : _PREFIX + size])
            del call.inbound[: _PREFIX + size]
            self.held -= _PREFIX + size
            if compressed:
                why = f"rdc gate: {call.path}: compressed request messages are refused (send them plain)"
                self._refuse(call, INVALID_ARGUMENT, why, ("bad-request",))
                return
            self._judged(call, self.judge(call.path, message))

    def _judged(self, call: _Call, verdict: Verdict) -> None:
        if verdict.refused:
            self._refuse(call, PERMISSION_DENIED, *_refusal(verdict))
            return
        self.report(call.path, 0, "; ".join(verdict.notes), ())
        if call.upstream_id is None:
            self._open_upstream(call)
        prefix = b"\x00" + len(verdict.message).to_bytes(4, "big")
        call.to_upstream.append(("data", prefix + verdict.message, 0))

    def _request_ended(self, stream_id: int) -> None:
        call = self.calls.get(stream_id)
        if call is None or call.client_ended:
            return
        call.client_ended = True
        if call.refused:
            return
        if call.checked and call.inbound:
            self._refuse(
                call,
                INVALID_ARGUMENT,
                f"rdc gate: {call.path}: the request ended inside a message",
                ("bad-request",),
            )
            return
        if call.upstream_id is None:
            self._open_upstream(call)
        call.to_upstream.append(("end", b"", 0))

    def _open_upstream(self, call: _Call) -> None:
        upstream_id = self.upstream.get_next_available_stream_id()
        call.upstream_id = upstream_id
        self.by_upstream[upstream_id] = call
        try:
            self.upstream.send_headers(upstream_id, call.headers)
        except h2.exceptions.ProtocolError:
            self._refuse(
                call,
                INVALID_ARGUMENT,
                f"rdc gate: {call.path}: its headers cannot be relayed",
                ("bad-request",),
            )

    def _refuse(self, call: _Call, status: int, message: str, rules: tuple[str, ...]) -> None:
        """Answer the call with `status` and end it on both sides."""
        call.refused = True
        self.held -= len(call.inbound)
        call.inbound.clear()
        call.to_upstream.clear()
        call.to_client.clear()
        self.report(call.path, status, message, rules)
        trailers: Headers = [(b"grpc-status", str(status).encode()), (b"grpc-message", grpc_message(message))]
        if not call.responded:
            trailers = [(b":status", b"200"), (b"content-type", b"application/grpc"), *trailers]
        call.responded = True
        try:
            self.client.send_headers(call.client_id, trailers, end_stream=True)
            if not call.client_ended:
                self.client.reset_stream(call.client_id, h2.errors.ErrorCodes.NO_ERROR)
        except h2.exceptions.StreamClosedError:
            pass
        except h2.exceptions.ProtocolError:
            _reset(self.client, call.client_id)
        if call.upstream_id is not None:
            _reset(self.upstream, call.upstream_id)
        self._forget(call)

    # --- the daemon's side ----------------------------------------------------------------------
    def _upstream_event(self, event: h2.events.Event) -> None:
        call = self.by_upstream.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ConnectionTerminated):
            self._close()
        elif call is None:
            if isinstance(event, h2.events.DataReceived) and event.stream_id:
                _ack(self.upstream, event.stream_id, event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.ResponseReceived):
            # A response of headers alone (a gRPC error) must reach the client as one, end included.
            kind = "trailers" if event.stream_ended is not None else "headers"
            call.response_ended = event.stream_ended is not None
            call.to_client.append((kind, list(event.headers or []), 0))
        elif isinstance(event, h2.events.DataReceived):
            call.to_client.append(("data", event.data or b"", event.flow_controlled_length or 0))
        elif isinstance(event, h2.events.TrailersReceived):
            call.response_ended = True
            call.to_client.append(("trailers", list(event.headers or []), 0))
        elif isinstance(event, h2.events.StreamEnded):
            if not call.response_ended:
                call.response_ended = True
                call.to_client.append(("end", b"", 0))
        elif isinstance(event, h2.events.StreamReset):
            self._forget(call)
            self.calls.pop(call.client_id, None)
            _reset(self.client, call.client_id, event.error_code or h2.errors.ErrorCodes.CANCEL)

    # --- moving queued items ----------------------------------------------------------------------
    def _flush(self) -> None:
        for call in list(self.calls.values()):
            if call.upstream_id is not None and call.to_upstream:
                _drain(call.to_upstream, self.upstream, call.upstream_id, self.client, call.client_id)
            if call.to_client:
                responded, ended = _drain(
                    call.to_client, self.client, call.client_id, self.upstream, call.upstream_id
                )
                call.responded = call.responded or responded
                if ended:  # a response ended toward the client: the call is over
                    self._forget(call)
                    self.calls.pop(call.client_id, None)

    # --- helpers --------------------------------------------------------------------------------
    def _forget(self, call: _Call) -> None:
        if call.upstream_id is not None:
            self.by_upstream.pop(call.upstream_id, None)
        self.held -= len(call.inbound)
        call.inbound.clear()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for conn in (self.client, self.upstream):
            with contextlib.suppress(h2.exceptions.ProtocolError):
                conn.close_connection()


# --- moving queued items, as the windows allow -------------------------------------------------------
def _drain(
    queue: deque[tuple[str, bytes | Headers, int]],
    out: h2.connection.H2Connection,
    out_id: int,
    source: h2.connection.H2Connection,
    source_id: int | None,
) -> tuple[bool, bool]:
    """Send what `queue` holds for stream `out_id` of `out` as far as its window allows, acknowledging
    each data item on the stream it came from; whether headers went out, and whether the stream ended."""
    headers = False
    try:
        while queue:
            kind, payload, flow = queue[0]
            if kind == "data":
                assert isinstance(payload, bytes)
                room = min(out.local_flow_control_window(out_id), out.max_outbound_frame_size)
                if room <= 0 and payload:
                    return headers, False
                part = payload[:room]
                out.send_data(out_id, part)
                if len(part) < len(payload):
                    queue[0] = (kind, payload[len(part) :], flow)
                    continue
                queue.popleft()
                if flow and source_id is not None:
                    _ack(source, source_id, flow)
            elif kind in ("headers", "trailers"):
                assert isinstance(payload, list)
                queue.popleft()
                headers = True
                out.send_headers(out_id, payload, end_stream=kind == "trailers")
                if kind == "trailers":
                    return headers, True
            else:
                queue.popleft()
                out.end_stream(out_id)
                return headers, True
    except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
        queue.clear()
        _reset(out, out_id)
    return headers, False


def _ack(conn: h2.connection.H2Connection, stream_id: int, flow: int) -> None:
    if not flow:
        return
    try:
        conn.acknowledge_received_data(flow, stream_id)
    except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
        conn.increment_flow_control_window(flow)  # the stream is gone; the connection's share is not


def _reset(conn: h2.connection.H2Connection, stream_id: int, code: int = h2.errors.ErrorCodes.CANCEL) -> None:
    with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
        conn.reset_stream(stream_id, code)
