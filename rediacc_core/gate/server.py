"""The gate: an HTTP/1.1 reverse proxy on a Unix socket in front of one repo's Docker daemon.

Each client connection gets its own upstream connection (opened on its first forwarded request)
and is served in lockstep: one request, then its whole response, then the next request. For every
request the decider says whether the body matters (`inspects`); such bodies are read whole (up to
MAX_INSPECTED_BODY) and decided, and what is forwarded is the decider's canonical body with a
Content-Length the gate computed. Every other body, and every response, is streamed as it arrives.

Small bodies are decided on the event loop (cheaper than a thread hop); big ones, and any decision
that would wait for I/O (an image lookup on the daemon, see `images.may_block`), run in a worker
thread, so a slow decision never stalls other clients.

Built on asyncio buffered protocols rather than streams: the data path is a few method calls per
read, every read lands in one shared 256 KiB buffer (nothing is allocated per read, nothing held per
idle connection), and flow control is transport pause/resume in both directions. uvloop's loop is
used when it is installed. A `101` answer (attach, exec start, BuildKit's h2c) turns the connection into a raw
tunnel that forwards each half-close to the other side.

Limits (`GateLimits`, defaults below), so that one tenant cannot exhaust the gate's memory: at most
`max_connections` client connections (one more is answered 503 and closed); a request head must be
complete within `head_timeout` seconds of its first byte, and an inspected body within `body_timeout`
of its head (else 408 and the connection closes: a slow-loris client is dropped); unfinished heads and
inspected bodies held across all connections stay under `max_buffered` bytes (the request that would
go over is answered 503). Streamed bodies are never held, so they have no deadline: flow control
keeps them at one read.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

from rediacc_core.gate.audit import NO_PEER, Audit, peer_of
from rediacc_core.gate.http import (
    BODY_CHUNKED,
    BODY_LENGTH,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    INTERIM,
    LAST_CHUNK,
    MAX_HEAD,
    MAX_INSPECTED_BODY,
    SWITCHED,
    ChunkedDecoder,
    FramingError,
    RequestHead,
    chunk_frame,
    error_response,
    find_head_end,
    parse_request_head,
    parse_response_head,
)
from rediacc_core.gate.images import MustNotBlock, decisions_must_not_block

Log = Callable[[str], None]

_WRITE_HIGH = 1024 * 1024  # per-direction buffer before the other side is paused
_PIPELINE_LIMIT = 1024 * 1024  # client bytes held while a response is pending
CONNECT_TIMEOUT = 10.0
READ_SIZE = 256 * 1024
INLINE_DECISION_MAX = 64 * 1024  # inspected bodies up to this are decided on the event loop
_JOIN_MAX = 64 * 1024  # head and body go out in one write up to this size
_INSPECTS_CACHE = 4096
_WHOLE_RESPONSE_MAX = 64 * 1024  # a read up to this size is tried as one whole response

MAX_CONNECTIONS = 4096  # client connections per gate (an idle one costs a few KiB and two descriptors)
HEAD_TIMEOUT = 30.0  # seconds from a head's first byte to its blank line
BODY_TIMEOUT = 60.0  # seconds from an inspected request's head to its body's last byte
MAX_BUFFERED = 64 * 1024 * 1024  # unfinished heads and inspected bodies held at once, all connections


@dataclass(frozen=True)
class GateLimits:
    """What one gate holds at most, and how long it waits for a request (see the module docstring)."""

    max_connections: int = MAX_CONNECTIONS
    head_timeout: float = HEAD_TIMEOUT
    body_timeout: float = BODY_TIMEOUT
    max_buffered: int = MAX_BUFFERED

    @property
    def sweep_interval(self) -> float:
        """How often deadlines are checked: a fraction of the shortest, at most a second."""
        return min(1.0, self.head_timeout / 4, self.body_timeout / 4)


class DecisionLike(Protocol):
    @property
    def forward(self) -> bool: ...
    @property
    def status(self) -> int: ...
    @property
    def message(self) -> str: ...
    @property
    def body(self) -> bytes | None: ...
    @property
    def log(self) -> tuple[str, ...]: ...


class DeciderLike(Protocol):
    """What the gate needs of `rediacc_core.gate.decide.Decider`."""

    def inspects(self, method: str, raw_target: str) -> bool: ...

    def head(self, method: str, raw_target: str) -> DecisionLike | None: ...

    def decide(self, method: str, raw_target: str, content_type: str | None, body: bytes) -> DecisionLike: ...


# Client-side states.
_HEAD, _BODY, _WAIT, _BUSY, _TUNNEL, _CLOSED = range(6)
# Response-side states.
_R_IDLE, _R_HEAD, _R_LENGTH, _R_CHUNKED, _R_TUNNEL = range(5)


class _Upstream(asyncio.BufferedProtocol):
    """The daemon side of one connection: hands everything to its `_Client`."""

    __slots__ = ("client", "lent", "transport")

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.lent = client.gate.read_buffer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH)

    def get_buffer(self, sizehint: int) -> memoryview:
        self.lent = self.client.gate.read_buffer
        return self.lent

    def buffer_updated(self, nbytes: int) -> None:
        self.client.upstream_data(self.lent[:nbytes])

    def eof_received(self) -> bool:
        return self.client.upstream_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.upstream_lost(self)

    def pause_writing(self) -> None:
        self.client.pause_reading("upstream-full")

    def resume_writing(self) -> None:
        self.client.resume_reading("upstream-full")


class _Client(asyncio.BufferedProtocol):
    """One client connection and everything about the exchange in progress on it."""

    def __init__(self, gate: GateServer) -> None:
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.lent = gate.read_buffer
        self.buf = bytearray()
        self.state = _HEAD
        self.paused: set[str] = set()
        self.req: RequestHead | None = None
        self.body_left = 0
        self.chunks: ChunkedDecoder | None = None
        self.inspect: bytearray | None = None
        self.refused: DecisionLike | None = None  # a request refused from its head, body still coming
        self.request_done = False
        self.body_read = False  # the whole request body is in (or there is none)
        self.client_eof = False
        self.upstream_eof_seen = False
        self.deadline = 0.0  # monotonic time by which the head or inspected body must be in (0: none)
        self.held = 0  # bytes of unfinished request this connection counts in `gate.buffered`
        self.peer = NO_PEER  # the client process (SO_PEERCRED), read once when auditing
        self.started = 0.0  # when the head of the request being decided was read
        # response side
        self.rstate = _R_IDLE
        self.rbuf = bytearray()
        self.rleft = 0
        self.rchunks: ChunkedDecoder | None = None
        self.rclose = False
        self.rsent = False  # some byte of the current response reached the client

    # --- asyncio.Protocol (client side) -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        if self.gate.audit is not None:
            self.peer = peer_of(transport)
        if len(self.gate.connections) >= self.gate.limits.max_connections:
            self.state = _CLOSED
            message = (
                f"the gate of repo {self.gate.repo_ref} has {self.gate.limits.max_connections} connections "
                "open (its limit); close idle clients or retry later"
            )
            self.gate.log(f"refused 503: {message}")
            self._audit_refusal(503, message, "limit")
            self.transport.write(error_response(503, message, close=True))
            self.transport.close()
            return
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH)
        self.gate.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        self.lent = self.gate.read_buffer
        return self.lent

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(self.lent[:nbytes])

    def data_received(self, data: memoryview) -> None:
        if self.state == _TUNNEL:
            self._to_upstream(data)
            return
        if self.state == _BODY and not self.buf:
            used = self._body(data)  # the common streaming case: no copy into self.buf
            if used < len(data):
                self.buf += data[used:]
                self._process()
            elif self.inspect is not None:
                self._account()
            return
        if self.state == _HEAD and not self.buf:
            # The usual keep-alive case: one read holds exactly one whole head and nothing else.
            # Parse it straight from the read (one copy, which is also the head cache's key).
            chunk = bytes(data)
            if find_head_end(chunk) == len(chunk):
                self._start_request(chunk)
                return
            self.buf += chunk
            self._process()
            return
        self.buf += data
        self._process()

    def eof_received(self) -> bool:
        self.client_eof = True
        if self.state == _TUNNEL:
            up = self.upstream
            if up is not None and up.transport is not None and up.transport.can_write_eof():
                up.transport.write_eof()  # stdin ended: the container sees EOF, output keeps flowing
            if self.upstream_eof_seen:
                self.close()
            return True
        if self.state in (_WAIT, _BUSY) and self.body_read:
            return True  # answer what was asked, then close
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.connections.discard(self)
        self.state = _CLOSED
        self._release()
        self._close_upstream()

    def pause_writing(self) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.pause_reading()

    def resume_writing(self) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.resume_reading()

    # --- helpers --------------------------------------------------------------------------------
    def pause_reading(self, reason: str) -> None:
        if not self.paused and self.transport is not None and self.state != _CLOSED:
            self.transport.pause_reading()
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self.paused:
            return
        self.paused.discard(reason)
        if not self.paused and self.transport is not None and self.state != _CLOSED:
            self.transport.resume_reading()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport is not None and self.state != _CLOSED:
            self.transport.write(data)
            self.gate.after_write(self.transport, data)

    def _to_upstream(self, data: bytes | bytearray | memoryview) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.write(data)
            self.gate.after_write(up.transport, data)

    def close(self) -> None:
        """Flush what is queued to the client, then close both sides."""
        if self.state != _CLOSED:
            self.state = _CLOSED
            if self.transport is not None:
                self.transport.close()
        self._release()
        self._close_upstream()

    def _account(self) -> None:
        """Bring this connection's share of `gate.buffered` up to date; 503 when it grew past the limit."""
        if self.state == _CLOSED:
            return
        held = len(self.buf) + (len(self.inspect) if self.inspect is not None else 0)
        grew = held - self.held
        gate = self.gate
        if grew > 0 and gate.buffered + grew > gate.limits.max_buffered:
            # What was read is let go with the connection: the gate never holds more than the limit
            # (plus the one read that would have gone over).
            mib = gate.limits.max_buffered // (1024 * 1024)
            self._fail(
                503,
                rule="limit",
                message=f"the gate of repo {gate.repo_ref} holds {mib} MiB of unfinished requests "
                "(its limit); retry later",
            )
            return
        self.held = held
        gate.buffered += grew
        if gate.buffered > gate.buffered_peak:
            gate.buffered_peak = gate.buffered

    def _release(self) -> None:
        self.gate.buffered -= self.held
        self.held = 0
        self.deadline = 0.0

    def expired(self, now: float) -> None:
        """Called by the gate's sweep once `deadline` has passed: drop the unfinished request."""
        what, limit = ("head", self.gate.limits.head_timeout)
        if self.state != _HEAD:
            what, limit = ("body", self.gate.limits.body_timeout)
        self._fail(
            408,
            rule="limit",
            message=f"the request {what} did not arrive within {limit:g} s; the gate closed the connection",
        )

    def _close_upstream(self) -> None:
        up, self.upstream = self.upstream, None
        if up is not None and up.transport is not None:
            up.transport.close()

    def _audit_refusal(self, status: int, message: str, rule: str) -> None:
        audit = self.gate.audit
        if audit is not None:
            req = self.req
            method, target = (req.method, req.target) if req is not None else ("", "")
            audit.record(self.peer, method, target, status=status, rules=(rule,), message=message)

    def _fail(self, status: int, message: str, rule: str = "http") -> None:
        """Answer with an error and close: the connection cannot be resynchronised.

        `rule` names the cause in the audit trail: `http` (framing), `limit`, `upstream`, `gate`.
        """
        head_only = self.req is not None and self.req.method == "HEAD"
        self.gate.log(f"refused {status}: {message}")
        self._audit_refusal(status, message, rule)
        if not (self.rsent and self.rstate != _R_IDLE):  # never inside a response already under way
            self._write(error_response(status, message, head_only=head_only, close=True))
        self.close()

    # --- the request side -----------------------------------------------------------------------
    def _process(self) -> None:
        while self.state == _HEAD and self.buf:
            end = find_head_end(self.buf)
            if end < 0:
                if len(self.buf) > MAX_HEAD:
                    self._fail(400, f"request head larger than {MAX_HEAD} bytes", "limit")
                elif not self.deadline:
                    self.deadline = time.monotonic() + self.gate.limits.head_timeout
                break
            head = bytes(self.buf[:end])
            del self.buf[:end]
            self._start_request(head)
            if self.state == _BODY and self.buf:
                data = bytes(self.buf)
                self.buf.clear()
                used = self._body(data)
                if used < len(data):
                    self.buf[:0] = memoryview(data)[used:]
        if self.state in (_WAIT, _BUSY) and len(self.buf) > _PIPELINE_LIMIT:
            self.pause_reading("pipeline")
        if self.held or self.buf or self.inspect is not None:
            self._account()

    def _start_request(self, head: bytes) -> None:
        try:
            req = parse_request_head(head)
        except FramingError as exc:
            self.req = None
            self._fail(exc.status, str(exc))
            return
        self.req = req
        self.deadline = 0.0
        self.gate.requests += 1
        self.request_done = False
        self.body_read = not req.has_body
        self.chunks = ChunkedDecoder(strict=True) if req.chunked else None
        self.body_left = req.content_length or 0
        try:
            refused = self.gate.head_refusal(req.method, req.target)
            inspected = refused is None and self.gate.inspects(req.method, req.target)
        except Exception as exc:
            self._fail(_status_of(exc), _message_of(exc), "gate")
            return
        if refused is not None:
            self._refuse_head(req, refused)
            return
        if inspected:
            self.inspect = bytearray()
            if req.expect_continue and req.has_body:
                self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.state = _BODY
            self.started = time.monotonic()
            if not req.has_body:
                self._body_complete()
            else:
                self.deadline = self.started + self.gate.limits.body_timeout
            return
        self.inspect = None
        if self.upstream is None:
            self.state = _BUSY
            self.pause_reading("connect")
            self.gate.spawn(self._connect_then(self._forward_head))
            return
        self._forward_head()

    def _refuse_head(self, req: RequestHead, decision: DecisionLike) -> None:
        """Answer a request refused from its head alone, once its body (read, never kept) has ended.

        Clients write the whole body before they read the answer (the docker CLI sending a build
        context does): answering and closing early would show them a broken pipe, not the reason.
        """
        self.inspect = None
        if req.has_body:
            self.refused = decision
            self.state = _BODY
            return
        self.state = _BUSY
        self._apply(req, b"", decision)

    def _forward_head(self) -> None:
        req = self.req
        assert req is not None
        self._begin_response()
        self._to_upstream(req.passthrough)
        self.state = _BODY
        if not req.has_body:
            self._body_complete()
        elif self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            used = self._body(data)
            if used < len(data):
                self.buf[:0] = memoryview(data)[used:]

    def _body(self, data: bytes | memoryview) -> int:
        """Consume body bytes from `data`; returns how many belonged to the body."""
        if self.chunks is not None:
            try:
                pieces, used = self.chunks.feed(data)
            except FramingError as exc:
                self._fail(exc.status, str(exc))
                return len(data)
            done = self.chunks.done
        else:
            used = min(self.body_left, len(data))
            pieces = [memoryview(data)[:used]] if used < len(data) else [memoryview(data)]
            self.body_left -= used
            done = not self.body_left
        if self.refused is not None:
            pass  # the body of a refused request: read and dropped
        elif self.inspect is not None:
            for piece in pieces:
                self.inspect += piece
            if len(self.inspect) > MAX_INSPECTED_BODY:
                self._fail(
                    400,
                    rule="limit",
                    message=f"request body larger than {MAX_INSPECTED_BODY // (1024 * 1024)} MiB: "
                    "the gate reads container and volume requests whole and refuses bigger ones",
                )
                return len(data)
        elif self.chunks is not None:
            frame = chunk_frame(pieces)
            if frame:
                self._writelines_upstream(frame)
            if done:
                self._to_upstream(LAST_CHUNK)
        elif used:
            self._to_upstream(pieces[0])
        if done:
            self._body_complete()
        return used

    def _writelines_upstream(self, parts: list[bytes | memoryview]) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.write(b"".join(parts))

    def _body_complete(self) -> None:
        self.body_read = True
        if self.refused is not None:
            decision, self.refused = self.refused, None
            assert self.req is not None
            self.state = _BUSY
            self._apply(self.req, b"", decision)
            return
        if self.inspect is not None:
            req, body = self.req, bytes(self.inspect)
            assert req is not None
            self.inspect = None
            self.deadline = 0.0
            self._account()
            self.state = _BUSY
            self.pause_reading("decide")
            self._decide(req, body)
            return
        self.request_done = True
        if self.rstate == _R_IDLE:  # the response already finished (an early answer)
            self._exchange_done()
        else:
            self.state = _WAIT

    def _decide(self, req: RequestHead, body: bytes) -> None:
        """Decide on the loop when that cannot stall it, else in a worker thread.

        A small body takes a bounded fraction of a millisecond to decide, less than handing it
        to a thread and back. Anything that would wait (an image lookup on the daemon) raises
        `MustNotBlock` inside an inline decision, and the decision starts over in a worker.
        """
        if len(body) <= INLINE_DECISION_MAX:
            try:
                with decisions_must_not_block():
                    decision = self.gate.decider.decide(req.method, req.target, req.content_type, body)
            except MustNotBlock:
                pass
            except Exception as exc:
                self._fail(_status_of(exc), _message_of(exc), "gate")
                return
            else:
                self._apply(req, body, decision)
                return
        self.gate.spawn(self._decide_in_worker(req, body))

    def _audit_decision(self, req: RequestHead, decision: DecisionLike) -> None:
        assert self.gate.audit is not None
        self.gate.audit.record(
            self.peer,
            req.method,
            req.target,
            status=200 if decision.forward else decision.status,
            endpoint=getattr(decision, "endpoint", ""),
            rules=getattr(decision, "rules", ()),
            cdi_asked=getattr(decision, "cdi_asked", ()),
            cdi_admitted=getattr(decision, "cdi_admitted", ()),
            message="" if decision.forward else decision.message,
            seconds=time.monotonic() - self.started,
        )

    async def _decide_in_worker(self, req: RequestHead, body: bytes) -> None:
        loop = asyncio.get_running_loop()
        decide = self.gate.decider.decide
        try:
            decision = await loop.run_in_executor(
                self.gate.executor, decide, req.method, req.target, req.content_type, body
            )
        except Exception as exc:
            self._fail(_status_of(exc), _message_of(exc), "gate")
            return
        self._apply(req, body, decision)

    def _apply(self, req: RequestHead, body: bytes, decision: DecisionLike) -> None:
        for line in decision.log:
            self.gate.log(line)
        if self.gate.audit is not None:
            self._audit_decision(req, decision)
        if self.state == _CLOSED:
            return
        if not decision.forward:
            if not decision.log:
                self.gate.log(f"refused {decision.status} {req.method} {req.target}: {decision.message}")
            head_only = req.method == "HEAD"
            closing = not req.keep_alive
            self._write(error_response(decision.status, decision.message, head_only=head_only, close=closing))
            if closing:
                self.close()
                return
            self.request_done = True
            self.resume_reading("decide")
            self._exchange_done()
            return
        forwarded = body if decision.body is None else decision.body
        if self.upstream is None:
            self.gate.spawn(self._connect_then(lambda: self._send_decided(req, forwarded)))
            return
        self._send_decided(req, forwarded)

    def _send_decided(self, req: RequestHead, forwarded: bytes) -> None:
        """Forward a decided request: the head with the gate's Content-Length, then the canonical body."""
        self._begin_response()
        framed = req.has_body or bool(forwarded)
        head = req.encode(content_length=len(forwarded) if framed else None, chunked=False)
        self._to_upstream(head + forwarded if len(forwarded) <= _JOIN_MAX else head)
        if len(forwarded) > _JOIN_MAX:
            self._to_upstream(forwarded)
        self.request_done = True
        self.state = _WAIT
        self.resume_reading("decide")

    async def _connect_then(self, then: Callable[[], None]) -> None:
        if await self._connect():
            self.resume_reading("connect")
            then()
            if self.client_eof and not self.body_read:
                self.close()  # the client went away before sending the body
                return
            self._process()

    async def _connect(self) -> bool:
        loop = asyncio.get_running_loop()
        path = self.gate.upstream_path
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_unix_connection(lambda: _Upstream(self), str(path)), CONNECT_TIMEOUT
            )
        except (OSError, TimeoutError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            self._fail(
                502,
                rule="upstream",
                message=f"the repo's Docker daemon is not answering at {path} ({reason}); "
                f"start it with: rdc repo up {self.gate.repo_ref}",
            )
            return False
        if self.state == _CLOSED:
            if protocol.transport is not None:
                protocol.transport.close()
            return False
        self.upstream = protocol
        self.upstream_eof_seen = False
        return True

    # --- the response side ----------------------------------------------------------------------
    def _begin_response(self) -> None:
        self.rstate = _R_HEAD
        self.rbuf.clear()
        self.rsent = False
        self.rclose = False

    def upstream_data(self, data: memoryview) -> None:
        if self.rstate == _R_TUNNEL:
            self._write(data)
            return
        if self.rstate == _R_HEAD:
            if not self.rbuf and len(data) <= _WHOLE_RESPONSE_MAX:
                chunk = bytes(data)
                if self._whole_response(chunk):
                    return
                self.rbuf += chunk
            else:
                self.rbuf += data
            self._response_heads()
            return
        self._response_body(data)

    def _whole_response(self, chunk: bytes) -> bool:
        """Relay the usual keep-alive answer, one read holding a head and exactly its body, as read.

        False (nothing done) for everything else, which `_response_heads` then handles.
        """
        end = find_head_end(chunk)
        if end < 0:
            return False
        req = self.req
        try:
            resp = parse_response_head(chunk[:end], req.method if req is not None else "GET")
        except ValueError:
            return False
        body = len(chunk) - end
        whole = (resp.body == BODY_LENGTH and resp.length == body) or (resp.body == BODY_NONE and not body)
        if not whole:
            return False
        self.rsent = True
        self.rclose = not resp.keep_alive or (req is not None and not req.keep_alive)
        self._write(chunk)
        self._response_complete()
        return True

    def _response_heads(self) -> None:
        req = self.req
        method = req.method if req is not None else "GET"
        while self.rstate == _R_HEAD:
            end = find_head_end(self.rbuf)
            if end < 0:
                if len(self.rbuf) > MAX_HEAD:
                    self._fail(502, "the daemon sent a response head that is too large", "upstream")
                return
            head = bytes(self.rbuf[:end])
            rest = bytes(self.rbuf[end:])
            self.rbuf.clear()
            try:
                resp = parse_response_head(head, method)
            except ValueError as exc:
                self._fail(502, str(exc), "upstream")
                return
            self.rsent = True
            if resp.body == INTERIM:
                self._write(head)
                self.rbuf += rest
                continue
            if resp.body == SWITCHED:
                self._tunnel(head + rest)
                return
            self.rclose = not resp.keep_alive or (req is not None and not req.keep_alive)
            if resp.body == BODY_NONE:
                self._write(head)
                self._response_complete()
            elif resp.body == BODY_LENGTH:
                self.rstate = _R_LENGTH
                self.rleft = resp.length
            elif resp.body == BODY_CHUNKED:
                self.rstate = _R_CHUNKED
                self.rchunks = ChunkedDecoder(strict=False)
            elif resp.body == BODY_UNTIL_CLOSE:
                # A hijacked stream without an upgrade (old clients): raw bytes both ways from here.
                self._tunnel(head + rest)
                return
            if resp.body != BODY_NONE:
                self._response_body(rest, head)  # head and body in one write: one syscall
            elif rest:
                self._response_body(rest)
            return

    def _response_body(self, data: bytes | memoryview, head: bytes = b"") -> None:
        if self.rstate == _R_LENGTH:
            if len(data) <= self.rleft:
                self._write(head + data if head else data)
                self.rleft -= len(data)
            else:
                self._write(head + data[: self.rleft])
                self.rleft = 0
                self.gate.log("the daemon sent bytes after a complete response; closing the connection")
                self.rclose = True
            if not self.rleft:
                self._response_complete()
        elif self.rstate == _R_CHUNKED:
            assert self.rchunks is not None
            try:
                _, used = self.rchunks.feed(data)
            except FramingError as exc:
                self.gate.log(f"bad chunked response from the daemon: {exc}")
                self.close()
                return
            part = data if used == len(data) else data[:used]
            self._write(head + part if head else part)
            if self.rchunks.done:
                if used < len(data):
                    self.rclose = True
                self._response_complete()
        elif self.rstate == _R_IDLE:
            self.gate.log("the daemon sent bytes with no request outstanding; closing the connection")
            self.close()

    def _response_complete(self) -> None:
        self.rstate = _R_IDLE
        self.rchunks = None
        if self.rclose or self.client_eof:
            self.close()
            return
        if self.request_done:
            self._exchange_done()
        # else: the daemon answered before the body was all sent; the rest still streams, and
        # _body_complete finishes the exchange.

    def _exchange_done(self) -> None:
        self.req = None
        self.state = _HEAD
        if self.client_eof:
            self.close()
            return
        self.resume_reading("pipeline")
        self._process()

    def _tunnel(self, rest: bytes | memoryview) -> None:
        self.rstate = _R_TUNNEL
        self.state = _TUNNEL
        if rest:
            self._write(rest)
        if self.buf:
            self._to_upstream(bytes(self.buf))
            self.buf.clear()
        if self.client_eof:
            up = self.upstream
            if up is not None and up.transport is not None and up.transport.can_write_eof():
                up.transport.write_eof()
        self.resume_reading("pipeline")

    def upstream_eof(self) -> bool:
        self.upstream_eof_seen = True
        if self.rstate == _R_TUNNEL:
            if self.transport is not None and self.state != _CLOSED and self.transport.can_write_eof():
                self.transport.write_eof()
            if self.client_eof:
                self.close()
            return True
        if self.rstate == _R_IDLE:
            self._close_upstream()  # an idle keep-alive connection the daemon let go; reopen on demand
        elif not self.rsent:
            self._fail(502, "the repo's Docker daemon closed the connection without answering", "upstream")
        else:
            self.close()  # cut mid-response: the client must see it, not a truncated success
        return False

    def upstream_lost(self, protocol: _Upstream) -> None:
        if self.upstream is not protocol:
            return
        self.upstream = None
        if self.rstate == _R_HEAD and not self.rsent:
            self._fail(502, "the repo's Docker daemon dropped the connection without answering", "upstream")
        elif self.rstate != _R_IDLE:
            self.close()


def _status_of(exc: BaseException) -> int:
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status < 600 else 500


def _message_of(exc: BaseException) -> str:
    if _status_of(exc) == 500:
        what = f"{type(exc).__name__}: {exc}"
        return f"the gate could not decide on this request ({what}); nothing was forwarded"
    return str(exc)


class GateServer:
    """The gate for one repo: listens on `listen_path`, forwards to the daemon at `upstream_path`."""

    def __init__(
        self,
        listen_path: Path,
        upstream_path: Path,
        decider: DeciderLike,
        *,
        log: Log | None = None,
        repo_ref: str = "<repo>",
        socket_mode: int = 0o660,
        limits: GateLimits | None = None,
        audit: Audit | None = None,
    ) -> None:
        self.listen_path = listen_path
        self.upstream_path = upstream_path
        self.decider = decider
        self.log: Log = log or (lambda line: None)
        self.repo_ref = repo_ref
        self.socket_mode = socket_mode
        self.limits = limits or GateLimits()
        self.audit = audit
        self.requests = 0  # request heads read, for the metrics
        self.connections: set[_Client] = set()
        self.buffered = 0  # bytes of unfinished requests held, all connections (see GateLimits)
        self.buffered_peak = 0  # the most `buffered` has been
        self._sweeper: asyncio.TimerHandle | None = None
        # One read buffer for every socket: reads are handled to the end before the next one, and
        # whatever must outlive a read is copied. So idle connections cost no buffer, and no read
        # allocates (asyncio's own 256 KiB reads each cost an allocation of that size).
        self.read_buffer = memoryview(bytearray(READ_SIZE))
        self._tasks: set[asyncio.Task[Any]] = set()
        # Decisions that must wait for something (an image lookup) run here, never on the loop.
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="gate-decide")
        self._inspects: dict[tuple[str, str], bool] = {}
        self._heads: dict[tuple[str, str], DecisionLike | None] = {}
        self._server: asyncio.AbstractServer | None = None

    def after_write(self, transport: asyncio.Transport, data: bytes | bytearray | memoryview) -> None:
        """Keep the shared read buffer safe from writes that are still queued.

        A transport may queue what it cannot send at once by reference rather than by copy
        (uvloop does, and so does asyncio from Python 3.12). So when a view of the read buffer
        stays queued, the gate moves on to a fresh buffer and leaves the old one to that write.
        This costs an allocation only while a peer is slower than its counterpart.
        """
        if isinstance(data, memoryview) and transport.get_write_buffer_size():
            self.read_buffer = memoryview(bytearray(READ_SIZE))

    def inspects(self, method: str, target: str) -> bool:
        """The decider's `inspects`, remembered: it depends on nothing but its arguments, and the
        same few (method, target) pairs make up most of the traffic."""
        key = (method, target)
        known = self._inspects.get(key)
        if known is None:
            known = self.decider.inspects(method, target)
            if len(self._inspects) >= _INSPECTS_CACHE:
                self._inspects.clear()
            self._inspects[key] = known
        return known

    def head_refusal(self, method: str, target: str) -> DecisionLike | None:
        """The decider's `head`, remembered like `inspects` (it too depends only on its arguments)."""
        key = (method, target)
        if key in self._heads:
            return self._heads[key]
        found = self.decider.head(method, target)
        if len(self._heads) >= _INSPECTS_CACHE:
            self._heads.clear()
        self._heads[key] = found
        return found

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        """Bind the socket (replacing a stale one, never a live one) and start accepting."""
        path = self.listen_path
        if path.exists() or path.is_symlink():
            if _answers(path):
                raise OSError(f"another process is already serving {path}")
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Client(self), str(path), backlog=1024)
        os.chmod(path, self.socket_mode)
        self._sweeper = loop.call_later(self.limits.sweep_interval, self._sweep)
        if self.audit is not None:
            self.audit.start_metrics(self.gauges)

    def gauges(self) -> tuple[int, int, int]:
        """What the metrics file reports besides the decisions: requests, connections, buffered bytes."""
        return self.requests, len(self.connections), self.buffered

    def _sweep(self) -> None:
        """Drop the connections whose head or inspected body is overdue. One timer per gate, not
        per request: a deadline costs a clock read where a request waits for more bytes."""
        now = time.monotonic()
        for client in [c for c in self.connections if c.deadline and c.deadline < now]:
            client.expired(now)
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(self.limits.sweep_interval, self._sweep)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        for client in list(self.connections):
            client.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
        with contextlib.suppress(FileNotFoundError):
            self.listen_path.unlink()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.audit is not None:
            self.audit.stop_metrics(self.gauges)
            self.audit.close()


def _answers(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (measurably faster for the proxy), else asyncio's."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
