"""The gate: an HTTP/1.1 reverse proxy on a Unix socket in front of one repo's Docker daemon.

Each client connection gets its own upstream connection (opened on its first forwarded request)
and is served in lockstep: one request, then its whole response, then the next request. For every
request the decider says whether the body matters (`inspects`); such bodies are read whole (up to
MAX_INSPECTED_BODY) and decided, and what is forwarded is the decider's canonical body with a
Content-Length the gate computed. Every other body, and every response, is streamed as it arrives.

Small bodies are decided on the event loop (cheaper than a thread hop); big ones, and any decision
that would wait for I/O (an image lookup on the daemon, see `blocking.may_block`), run in a worker
thread, so a slow decision never stalls other clients.

Where each message starts and ends is not decided here: `framing.py` holds the two sans-IO framers
(requests from the client, responses from the daemon) and their transition tables. `_Client` is the
asyncio glue: it feeds each read to a framer and acts on the events that come back (ask the
decider, write, pause or resume reading, close), and keeps the limits and the audit calls.

Built on asyncio buffered protocols rather than streams: the data path is a few method calls per
read, every read lands in one shared 256 KiB buffer (nothing is allocated per read, nothing held per
idle connection), and flow control is transport pause/resume in both directions. uvloop's loop is
used when it is installed. A `101` answer (attach, exec start, BuildKit's session), or an answer whose
body runs until the daemon closes (a hijacked stream), turns the connection into a raw tunnel that
forwards each half-close to the other side; BuildKit's `/grpc` after its `101` goes to a
`buildkit.relay.GrpcRelay` instead, which relays and checks it call by call.

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
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, cast

from rediacc_core.blocking import MustNotBlock, decisions_must_not_block
from rediacc_core.gate.audit.log import Audit
from rediacc_core.gate.audit.peer import NO_PEER, peer_of
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.relay import GrpcRelay
from rediacc_core.gate.http.framing import (
    COMPLETE,
    END,
    HEAD,
    IDLE,
    TUNNEL,
    Data,
    ProtocolError,
    RequestEvent,
    RequestFramer,
    ResponseFramer,
)
from rediacc_core.gate.http.messages import (
    LAST_CHUNK,
    MAX_INSPECTED_BODY,
    RequestHead,
    ResponseHead,
    chunk_frame,
    error_response,
    json_response,
)
from rediacc_core.unixhttp import listening

Log = Callable[[str], None]

_WRITE_HIGH = 1024 * 1024  # per-direction buffer before the other side is paused
_PIPELINE_LIMIT = 1024 * 1024  # client bytes held while a response is pending
CONNECT_TIMEOUT = 10.0
READ_SIZE = 256 * 1024
INLINE_DECISION_MAX = 64 * 1024  # inspected bodies up to this are decided on the event loop
_JOIN_MAX = 64 * 1024  # head and body go out in one write up to this size
_ROUTES_CACHE = 4096
LISTEN_BACKLOG = 1024

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

    def share(self, workers: int) -> GateLimits:
        """What each of `workers` processes of one gate may hold, so that together they hold no
        more than the gate's limits."""
        return replace(
            self,
            max_connections=max(1, self.max_connections // workers),
            max_buffered=max(1, self.max_buffered // workers),
        )


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

    def remembers(self, method: str, raw_target: str) -> bool: ...

    def decide(self, method: str, raw_target: str, content_type: str | None, body: bytes) -> DecisionLike: ...

    def judge_grpc(self, path: str, message: bytes) -> Verdict:
        """One message of a BuildKit gRPC call, for the relay (`buildkit.relay`)."""


def _grpc_upgrade(req: RequestHead | None) -> bool:
    """Is `req` BuildKit's `/grpc` upgrade, whose connection the gate relays call by call?"""
    if req is None or req.method != "POST":
        return False
    path = req.target.partition("?")[0]
    return path == "/grpc" or (path.startswith("/v") and path.endswith("/grpc") and path.count("/") == 2)


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
    """One client connection: asyncio glue around its two framers (`framing`).

    Reads go to the framers; their events are acted on here: ask the decider, write, pause or
    resume reading, close. What the request in progress is waiting for follows from the framers'
    states and from `refused` / `inspect` (how its body is handled: dropped, read whole, or
    streamed to the daemon as it comes). It also holds the connection's limits (buffered bytes,
    head and body timeouts), writes each decision to the audit trail, switches to a raw tunnel
    after a 101 or a hijacked stream, and hands `/grpc` to the BuildKit relay.
    """

    def __init__(self, gate: GateServer) -> None:
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.unsent: list[bytes] | None = None  # request bytes held while the upstream connects
        self.lent = gate.read_buffer
        self.requests = RequestFramer()
        self.responses = ResponseFramer()
        self.closed = False
        self.tunnel = False  # raw bytes both ways (after a 101, or a hijacked stream)
        self.relay: GrpcRelay | None = None  # BuildKit's /grpc after its 101: relayed call by call
        self.paused: set[str] = set()
        self.req: RequestHead | None = None  # the request being served
        self.refused: DecisionLike | None = None  # refused from its head: its body is read and dropped
        self.inspect: bytearray | None = None  # its body, read whole for the decider
        self.close_after = False  # the response in progress ends the connection
        self.client_eof = False
        self.upstream_eof_seen = False
        self.framing = False  # inside `_frame`: a finished exchange lets it frame the next request
        self.next_due = False  # an exchange ended inside `_frame`: it frames the next request
        self.deadline = 0.0  # monotonic time by which the head or inspected body must be in (0: none)
        self.held = 0  # bytes of unfinished request this connection counts in `gate.buffered`
        self.peer = NO_PEER  # the client process (SO_PEERCRED), read once when auditing
        self.started = 0.0  # when the head of the request being decided was read

    # --- asyncio.Protocol (client side) -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        if self.gate.audit is not None:
            self.peer = peer_of(transport)
        if len(self.gate.connections) >= self.gate.limits.max_connections:
            self.closed = True
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
        if self.relay is not None:
            self.relay.client_data(bytes(self.lent[:nbytes]))
            self._pump_relay()
        elif self.tunnel:
            self._to_upstream(self.lent[:nbytes])
        else:
            self._frame(self.requests.feed(self.lent[:nbytes]))

    def eof_received(self) -> bool:
        self.client_eof = True
        if self.relay is not None:
            self.relay.client_eof()
            self._pump_relay()
            return False
        if self.tunnel:
            up = self.upstream
            if up is not None and up.transport is not None and up.transport.can_write_eof():
                up.transport.write_eof()  # stdin ended: the container sees EOF, output keeps flowing
            if self.upstream_eof_seen:
                self.close()
            return True
        if self.requests.state is COMPLETE:
            return True  # answer what was asked, then close
        self.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.connections.discard(self)
        self.closed = True
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
        if not self.paused and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self.paused.add(reason)

    def resume_reading(self, reason: str) -> None:
        if reason not in self.paused:
            return
        self.paused.discard(reason)
        if not self.paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)
            if type(data) is memoryview:
                self.gate.after_write(self.transport, data)

    def _to_upstream(self, data: bytes | bytearray | memoryview) -> None:
        """Pass bytes to the daemon; held (copied) while a connection to it is being made."""
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.write(data)
            if type(data) is memoryview:
                self.gate.after_write(up.transport, data)
        elif self.unsent is not None:
            self.unsent.append(bytes(data))

    def _connect_soon(self) -> None:
        """Open the upstream connection; requests written meanwhile are held and read no further."""
        if self.unsent is None:
            self.unsent = []
            self.pause_reading("connect")
            self.gate.spawn(self._connect_then_send())

    def close(self) -> None:
        """Flush what is queued to the client, then close both sides."""
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        self._release()
        self._close_upstream()

    def _account(self) -> None:
        """Bring this connection's share of `gate.buffered` up to date; 503 when it grew past the limit."""
        if self.closed:
            return
        held = len(self.requests.held)
        if self.relay is not None:
            held += self.relay.held
        if self.inspect is not None:
            held += len(self.inspect)
        if self.unsent:
            held += sum(len(part) for part in self.unsent)
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
        if self.requests.state is not HEAD:
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
        if not self.responses.under_way:  # never inside a response already under way
            self._write(error_response(status, message, head_only=head_only, close=True))
        self.close()

    # --- the request side -----------------------------------------------------------------------
    def _frame(self, events: Sequence[RequestEvent]) -> None:
        """Act on the request framer's events; then on the next request's, as each exchange ends."""
        self.framing = True
        try:
            while True:
                for event in events:
                    if self.closed:
                        return
                    if type(event) is RequestHead:
                        self._start_request(event)
                    elif event is END:
                        self._request_complete()
                    elif type(event) is memoryview or type(event) is bytes:
                        self._body_data(event)
                    elif type(event) is ProtocolError:
                        self._fail(event.status, event.message, event.rule)
                if not self.next_due or self.closed:
                    break
                self.next_due = False
                events = self.requests.next_request()
        finally:
            self.framing = False
        if self.closed:
            return
        requests = self.requests
        pending = requests.held
        if requests.state is HEAD:
            if pending and not self.deadline:
                self.deadline = time.monotonic() + self.gate.limits.head_timeout
        elif requests.state is COMPLETE and len(pending) > _PIPELINE_LIMIT:
            self.pause_reading("pipeline")
        if pending or self.held or self.inspect is not None or self.unsent:
            self._account()

    def _start_request(self, req: RequestHead) -> None:
        self.req = req
        self.deadline = 0.0
        self.gate.requests += 1
        try:
            refused, inspected = self.gate.route(req.method, req.target)
        except Exception as exc:
            self._fail(_status_of(exc), _message_of(exc), "gate")
            return
        if refused is not None:
            # Answered once its body (read, never kept) has ended: clients write the whole body
            # before they read the answer (the docker CLI sending a build context does), and
            # answering early would show them a broken pipe, not the reason.
            self.refused = refused
            self.inspect = None
            return
        if inspected:
            self.inspect = bytearray()
            self.started = time.monotonic()
            if req.has_body:
                if req.expect_continue:
                    self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.deadline = self.started + self.gate.limits.body_timeout
            return
        self.inspect = None
        self.responses.request_sent(req.method)
        if self.upstream is None:
            self._connect_soon()
        self._to_upstream(req.passthrough)

    def _body_data(self, data: Data) -> None:
        if self.refused is not None:
            return  # the body of a refused request: read and dropped
        inspect = self.inspect
        if inspect is not None:
            inspect += data
            if len(inspect) > MAX_INSPECTED_BODY:
                self._fail(
                    400,
                    rule="limit",
                    message=f"request body larger than {MAX_INSPECTED_BODY // (1024 * 1024)} MiB: "
                    "the gate reads container and volume requests whole and refuses bigger ones",
                )
            return
        req = self.req
        assert req is not None
        if req.chunked:  # re-framed by the gate: the daemon reads exactly the chunks the gate parsed
            self._to_upstream(b"".join(chunk_frame([memoryview(data)])))
        else:
            self._to_upstream(data)

    def _request_complete(self) -> None:
        req = self.req
        assert req is not None
        if self.refused is not None:
            decision, self.refused = self.refused, None
            self._apply(req, b"", decision)
            return
        if self.inspect is not None:
            body = bytes(self.inspect)
            self.inspect = None
            self.deadline = 0.0
            self._account()
            self.pause_reading("decide")
            self._decide(req, body)
            return
        if req.chunked:
            self._to_upstream(LAST_CHUNK)
        if self.responses.state is IDLE:  # the response already finished (an early answer)
            self._exchange_done()
        # else the response is on its way; its end finishes the exchange

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
        if self.closed:
            return
        if not decision.forward:
            head_only = req.method == "HEAD"
            closing = not req.keep_alive
            answer = getattr(decision, "answer", None)
            if answer is not None:  # the gate's own answer (`views`), not a refusal
                self._write(json_response(answer, close=closing))
            else:
                if not decision.log:
                    self.gate.log(f"refused {decision.status} {req.method} {req.target}: {decision.message}")
                self._write(
                    error_response(decision.status, decision.message, head_only=head_only, close=closing)
                )
            if closing:
                self.close()
                return
            self.resume_reading("decide")
            self._exchange_done()
            return
        self._send_decided(req, body if decision.body is None else decision.body)

    def _send_decided(self, req: RequestHead, forwarded: bytes) -> None:
        """Forward a decided request: the head with the gate's Content-Length, then the canonical body."""
        self.responses.request_sent(req.method)
        if self.upstream is None:
            self._connect_soon()
        framed = req.has_body or bool(forwarded)
        head = req.encode(content_length=len(forwarded) if framed else None, chunked=False)
        self._to_upstream(head + forwarded if len(forwarded) <= _JOIN_MAX else head)
        if len(forwarded) > _JOIN_MAX:
            self._to_upstream(forwarded)
        self.resume_reading("decide")

    async def _connect_then_send(self) -> None:
        if not await self._connect():
            return
        unsent, self.unsent = self.unsent or [], None
        for data in unsent:
            self._to_upstream(data)
        self.resume_reading("connect")
        if self.held:
            self._account()

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
        if self.closed:
            if protocol.transport is not None:
                protocol.transport.close()
            return False
        self.upstream = protocol
        self.upstream_eof_seen = False
        return True

    def _exchange_done(self) -> None:
        self.req = None
        if self.client_eof:
            self.close()
            return
        if self.paused:
            self.resume_reading("pipeline")
        if self.framing:
            self.next_due = True  # `_frame` goes on with the next request: a loop, not recursion
            return
        events = self.requests.next_request()
        if events or self.requests.held or self.held:
            self._frame(events)

    # --- the response side ----------------------------------------------------------------------
    def upstream_data(self, data: memoryview) -> None:
        if self.relay is not None:
            self.relay.upstream_data(bytes(data))
            self._pump_relay()
            return
        if self.tunnel:
            self._write(data)
            return
        # Only the last event of a read can close the connection (an end, or an error), so unlike
        # `_frame` this loop need not look for a close between events.
        for event in self.responses.feed(data):
            if type(event) is bytes or type(event) is memoryview:
                if self.relay is not None:  # the daemon's first HTTP/2 bytes, read with its 101
                    self.relay.upstream_data(bytes(event))
                    self._pump_relay()
                else:
                    self._write(event)
            elif event is END:
                self._response_complete()
            elif type(event) is ResponseHead:
                req = self.req
                self.close_after = not event.keep_alive or (req is not None and not req.keep_alive)
            elif event is TUNNEL:
                self._tunnel()
            elif type(event) is ProtocolError:
                self._response_failed(event)

    def _response_failed(self, error: ProtocolError) -> None:
        if error.status:
            self._fail(error.status, error.message, error.rule)
        else:  # part of the response is out: the client must see it cut, not a truncated success
            self.gate.log(error.message)
            self.close()

    def _response_complete(self) -> None:
        if self.close_after or self.client_eof:
            self.close()
            return
        if self.requests.state is COMPLETE:
            self._exchange_done()
        # else: the daemon answered before the body was all sent; the rest still streams, and
        # the request's end finishes the exchange.

    def _tunnel(self) -> None:
        self.tunnel = True
        rest = self.requests.switch_to_tunnel()
        if _grpc_upgrade(self.req):
            self.relay = GrpcRelay(self._judge_grpc, self._grpc_report)
            if rest:
                self.relay.client_data(rest)
            if self.client_eof:
                self.relay.client_eof()
            self._pump_relay()
            self.resume_reading("pipeline")
            return
        if rest:
            self._to_upstream(rest)
        if self.client_eof:
            up = self.upstream
            if up is not None and up.transport is not None and up.transport.can_write_eof():
                up.transport.write_eof()
        self.resume_reading("pipeline")

    def upstream_eof(self) -> bool:
        self.upstream_eof_seen = True
        if self.relay is not None:
            self.relay.upstream_eof()
            self._pump_relay()
            return False
        if self.tunnel:
            if self.transport is not None and not self.closed and self.transport.can_write_eof():
                self.transport.write_eof()
            if self.client_eof:
                self.close()
            return True
        if self.closed:
            return False
        failure = self.responses.eof("closed")
        if failure is None:
            self._close_upstream()  # an idle keep-alive connection the daemon let go; reopen on demand
        else:
            self._response_failed(failure)
        return False

    # --- BuildKit's /grpc ------------------------------------------------------------------------
    def _pump_relay(self) -> None:
        """Send what the relay has for each side; close once it is done."""
        relay = self.relay
        assert relay is not None
        to_client = relay.for_client()
        if to_client:
            self._write(to_client)
        to_upstream = relay.for_upstream()
        if to_upstream:
            self._to_upstream(to_upstream)
        if relay.closed:
            self.close()
        elif relay.held != self.held:
            self._account()

    def _judge_grpc(self, path: str, message: bytes) -> Verdict:
        return self.gate.decider.judge_grpc(path, message)

    def _grpc_report(self, path: str, status: int, message: str, rules: tuple[str, ...]) -> None:
        """A checked or refused gRPC call, for the gate's log and the audit trail."""
        if status:
            self.gate.log(f"refused grpc-status {status} {path}: {message}")
        elif message:
            self.gate.log(f"admitted {path}: {message}")
        audit = self.gate.audit
        if audit is not None:
            audit.record(
                self.peer,
                "POST",
                f"/grpc{path}",
                status=403 if status else 200,
                endpoint="grpc",
                rules=rules,
                message=message if status else "",
            )

    def upstream_lost(self, protocol: _Upstream) -> None:
        if self.upstream is not protocol:
            return
        self.upstream = None
        if self.tunnel:
            self.close()
        elif not self.closed:
            failure = self.responses.eof("dropped")
            if failure is not None:
                self._response_failed(failure)


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
        self._routes: dict[tuple[str, str], tuple[DecisionLike | None, bool]] = {}
        self._server: asyncio.AbstractServer | None = None
        self._owns_socket = False  # bound by `start` itself, so removed by `close`

    def after_write(self, transport: asyncio.Transport, data: bytes | bytearray | memoryview) -> None:
        """Keep the shared read buffer safe from writes that are still queued.

        A transport may queue what it cannot send at once by reference rather than by copy
        (uvloop does, and so does asyncio from Python 3.12). So when a view of the read buffer
        stays queued, the gate moves on to a fresh buffer and leaves the old one to that write.
        This costs an allocation only while a peer is slower than its counterpart.
        """
        if isinstance(data, memoryview) and transport.get_write_buffer_size():
            self.read_buffer = memoryview(bytearray(READ_SIZE))

    def route(self, method: str, target: str) -> tuple[DecisionLike | None, bool]:
        """The decider's answers from a request's head alone, remembered: `head` (a refusal, or
        None) and, unless refused, `inspects`. Both depend on nothing but their arguments (save for
        the routes decided by their query, which the decider does not let be remembered), and the
        same few (method, target) pairs make up most of the traffic."""
        key = (method, target)
        known = self._routes.get(key)
        if known is None:
            refused = self.decider.head(method, target)
            known = (refused, refused is None and self.decider.inspects(method, target))
            if not self.decider.remembers(method, target):
                return known  # decided by its query and the machine's settings: asked every time
            if len(self._routes) >= _ROUTES_CACHE:
                self._routes.clear()
            self._routes[key] = known
        return known

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    async def start(self, listener: socket.socket | None = None) -> None:
        """Start accepting: on `listener` when given (a socket bound by `bind_listener`, shared with
        other worker processes, which its binder removes), else on a socket bound here."""
        if listener is None:
            listener = bind_listener(self.listen_path, self.socket_mode)
            self._owns_socket = True
        loop = asyncio.get_running_loop()
        # From Python 3.13 (and in uvloop there) a server removes its socket file when it closes.
        # `close` does that itself, and only for a socket it bound: a worker stopping must not
        # remove the socket its siblings still accept on.
        if sys.version_info >= (3, 13):
            self._server = await loop.create_unix_server(
                lambda: _Client(self), sock=listener, cleanup_socket=False
            )
        else:
            self._server = await loop.create_unix_server(lambda: _Client(self), sock=listener)
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
        if self._owns_socket:
            with contextlib.suppress(FileNotFoundError):
                self.listen_path.unlink()
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self.audit is not None:
            self.audit.stop_metrics(self.gauges)
            self.audit.close()


def bind_listener(path: Path, mode: int = 0o660) -> socket.socket:
    """The gate's listening socket at `path` (replacing a stale socket, never a live one)."""
    if path.exists() or path.is_symlink():
        if listening(path):
            raise OSError(f"another process is already serving {path}")
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(path))
        os.chmod(path, mode)
        listener.listen(LISTEN_BACKLOG)
        listener.setblocking(False)
    except BaseException:
        listener.close()
        raise
    return listener


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when it is installed (measurably faster for the proxy), else asyncio's."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
