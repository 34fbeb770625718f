"""The gate: an HTTP/1.1 reverse proxy on a Unix socket in front of one repo's Docker daemon.

Each client connection gets its own upstream connection (opened on its first forwarded request)
and is served in lockstep: one request, then its whole response, then the next request. Every
request's head is resolved once (target parsed, route found: `policy/endpoints.resolve`), and the
decider says from it whether the body matters (`inspects`); such bodies are read whole (up to
MAX_INSPECTED_BODY) and decided on that same resolved head, and what is forwarded is the decider's
canonical body with a Content-Length the gate computed. Every other body, and every response, is
streamed as it arrives.

Small bodies are decided on the event loop (cheaper than a thread hop); big ones, and any decision
that would wait for I/O (an image lookup on the daemon, see `blocking.may_block`), run in a worker
thread, so a slow decision never stalls other clients.

What each connection does next is not decided here: `http/framing.py` holds the two sans-IO
framers (requests from the client, responses from the daemon) and `http/exchange.py` the
connection's joint state (lockstep, refused and inspected bodies, the next request, close-after,
half-close, connecting, the tunnel switch), each with its transition tables. `_Client` is the
asyncio glue: it hands each read to its `Exchange` and performs the actions that come back (ask
the decider, connect, write, pause or resume reading, close), and keeps the limits' accounting,
the audit calls and BuildKit's relay.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, cast

from rediacc_core.blocking import MustNotBlock, decisions_must_not_block
from rediacc_core.gate.audit.log import Audit
from rediacc_core.gate.audit.peer import NO_PEER, Peer, peer_of
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.relay import GrpcRelay
from rediacc_core.gate.decide.decision import Decision
from rediacc_core.gate.http.exchange import Exchange
from rediacc_core.gate.http.messages import RequestHead, error_response
from rediacc_core.gate.policy.endpoints import Resolved
from rediacc_core.unixhttp import listening

Log = Callable[[str], None]

_WRITE_HIGH = 1024 * 1024  # per-direction buffer before the other side is paused
_DECIDING = "decide"  # the exchange's pause while its request is decided
CONNECT_TIMEOUT = 10.0
READ_SIZE = 256 * 1024
INLINE_DECISION_MAX = 64 * 1024  # inspected bodies up to this are decided on the event loop
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


class DeciderLike(Protocol):
    """What the gate needs of `rediacc_core.gate.decide.decider.Decider`."""

    def resolve(self, method: str, raw_target: str) -> Resolved:
        """The request's target parsed and its route found: done once per request, by `route`."""

    def inspects(self, request: Resolved) -> bool: ...

    def head(self, request: Resolved) -> Decision | None: ...

    def remembers(self, request: Resolved) -> bool: ...

    def decide_resolved(self, request: Resolved, content_type: str | None, body: bytes) -> Decision: ...

    def judge_grpc(self, path: str, message: bytes) -> Verdict:
        """One message of a BuildKit gRPC call, for the relay (`buildkit.relay`)."""


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
        client = self.client
        if client.relay is not None:
            client.relay.upstream_data(bytes(self.lent[:nbytes]))
        else:
            client.exchange.upstream_data(self.lent[:nbytes])

    def eof_received(self) -> bool:
        client = self.client
        keep = client.exchange.upstream_ended()
        if client.relay is not None:
            client.relay.upstream_eof()
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        client = self.client
        if client.upstream is self:
            client.upstream = None
            client.exchange.upstream_lost()

    def pause_writing(self) -> None:
        self.client.pause("upstream-full")

    def resume_writing(self) -> None:
        self.client.resume("upstream-full")


class _Client(asyncio.BufferedProtocol):
    """One client connection: performs what its `Exchange` (`http/exchange.py`) asks.

    The exchange owns the connection's HTTP/1.1 state; this is the asyncio side of it: reads into
    the gate's shared buffer, writes, flow control both ways, the decider (inline or in a worker),
    the connection to the daemon, the limits' accounting, the log and the audit trail, and
    BuildKit's gRPC relay once the exchange hands `/grpc` over.
    """

    def __init__(self, gate: GateServer) -> None:
        self.gate = gate
        limits = gate.limits
        self.exchange = Exchange(self, head_timeout=limits.head_timeout, body_timeout=limits.body_timeout)
        self.transport: asyncio.Transport | None = None
        self.upstream: _Upstream | None = None
        self.lent = gate.read_buffer
        self.relay: _Relay | None = None  # BuildKit's /grpc after its 101: relayed call by call
        self.paused: set[str] = set()  # why the exchange wants no reads (`Exchange` says)
        self.reading_stopped = False  # whether the transport's reading is stopped for them
        self.held = 0  # bytes of unfinished request this connection counts in `gate.buffered`
        self.peer = NO_PEER  # the client process (SO_PEERCRED), read once when auditing
        # The head of the request whose body is being read for the decider, resolved by `route`:
        # the exchange is in lockstep, so it is the one `decide` is asked about next.
        self.resolved: Resolved | None = None

    # --- asyncio.Protocol (client side) -------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        if self.gate.audit is not None:
            self.peer = peer_of(transport)
        if len(self.gate.connections) >= self.gate.limits.max_connections:
            self.exchange.closed = True
            message = (
                f"the gate of repo {self.gate.repo_ref} has {self.gate.limits.max_connections} connections "
                "open (its limit); close idle clients or retry later"
            )
            self.refused(503, message, "limit")
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
        else:
            self.exchange.client_data(self.lent[:nbytes])

    def eof_received(self) -> bool:
        keep = self.exchange.client_ended()
        if self.relay is not None:
            self.relay.client_eof()
        return keep

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.connections.discard(self)
        self.exchange.lost()
        self._release()
        self._close_upstream()

    def pause_writing(self) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.pause_reading()
        if self.relay is not None:
            # HTTP/2 answers some frames itself (PING, SETTINGS): a client that does not read stops
            # being read, so what the gate owes it cannot grow.
            self.pause("client-reads")

    def resume_writing(self) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.resume_reading()
        self.resume("client-reads")

    # --- the exchange's actions -----------------------------------------------------------------
    def route(self, method: str, target: str) -> tuple[Decision | None, bool]:
        self.gate.requests += 1
        refused, self.resolved = self.gate.route(method, target)
        return refused, self.resolved is not None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport is not None and not self.exchange.closed:
            self.transport.write(data)
            if type(data) is memoryview:
                self.gate.after_write(self.transport, data)

    def send(self, data: bytes | bytearray | memoryview) -> None:
        up = self.upstream
        if up is not None and up.transport is not None:
            up.transport.write(data)
            if type(data) is memoryview:
                self.gate.after_write(up.transport, data)

    def connect(self) -> None:
        self.gate.spawn(self._connect())

    def pause(self, reason: str) -> None:
        self.paused.add(reason)
        # A decision made inline is over before the loop reads again: reading stops only when it
        # goes to a worker (`decide`), which spares two epoll changes per decided request.
        if reason != _DECIDING:
            self._stop_reading()

    def _stop_reading(self) -> None:
        if not self.reading_stopped and self.transport is not None and not self.exchange.closed:
            self.transport.pause_reading()
            self.reading_stopped = True

    def resume(self, reason: str) -> None:
        if reason not in self.paused:
            return
        self.paused.discard(reason)
        if not self.paused and self.reading_stopped:
            self.reading_stopped = False
            if self.transport is not None and not self.exchange.closed:
                self.transport.resume_reading()

    def end_upstream(self) -> None:
        up = self.upstream
        if up is not None and up.transport is not None and up.transport.can_write_eof():
            up.transport.write_eof()

    def end_client(self) -> None:
        if self.transport is not None and self.transport.can_write_eof():
            self.transport.write_eof()

    def drop_upstream(self) -> None:
        self._close_upstream()

    def close(self, first: bool = False) -> None:
        """Flush what is queued to the client, then close both sides."""
        if not self.exchange.closed:
            self.exchange.close()  # which comes back here
            return
        if first and self.transport is not None:
            self.transport.close()
        self._release()
        self._close_upstream()

    def account(self) -> None:
        """Bring this connection's share of `gate.buffered` up to date; 503 when it grew past the limit."""
        if self.exchange.closed:
            return
        held = self.exchange.holding()
        if self.relay is not None:
            held += self.relay.held
        grew = held - self.held
        gate = self.gate
        if grew > 0 and gate.buffered + grew > gate.limits.max_buffered:
            # What was read is let go with the connection: the gate never holds more than the limit
            # (plus the one read that would have gone over).
            mib = gate.limits.max_buffered // (1024 * 1024)
            message = (
                f"the gate of repo {gate.repo_ref} holds {mib} MiB of unfinished requests (its limit); "
                "retry later"
            )
            self.exchange.fail(503, message, "limit")
            return
        self.held = held
        gate.buffered += grew
        if gate.buffered > gate.buffered_peak:
            gate.buffered_peak = gate.buffered

    def refused(self, status: int, message: str, rule: str) -> None:
        self.gate.log(f"refused {status}: {message}")
        audit = self.gate.audit
        if audit is not None:
            req = self.exchange.req
            method, target = (req.method, req.target) if req is not None else ("", "")
            audit.record(self.peer, method, target, status=status, rules=(rule,), message=message)

    def log(self, line: str) -> None:
        self.gate.log(line)

    def _release(self) -> None:
        self.gate.buffered -= self.held
        self.held = 0

    def _close_upstream(self) -> None:
        up, self.upstream = self.upstream, None
        if up is not None and up.transport is not None:
            up.transport.close()

    # --- deciding -------------------------------------------------------------------------------
    def decide(self, req: RequestHead, body: bytes) -> None:
        resolved, self.resolved = self.resolved, None
        if resolved is None or (resolved.method, resolved.raw_target) != (req.method, req.target):
            # Never so while the exchange keeps lockstep; if it were, nothing is forwarded.
            self.exchange.undecided(RuntimeError("the request decided is not the one whose head was read"))
            return
        if not self.gate.decide(self.exchange, req, resolved, body) and _DECIDING in self.paused:
            self._stop_reading()  # decided in a worker: nothing more is read until it answers

    def judged(self, req: RequestHead, decision: Decision) -> None:
        self.gate.judged(self.peer, req, decision, self.exchange.started)

    # --- the daemon's connection ----------------------------------------------------------------
    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        path = self.gate.upstream_path
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):  # no task of its own, unlike wait_for
                _, protocol = await loop.create_unix_connection(lambda: _Upstream(self), str(path))
        except (OSError, TimeoutError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            self.exchange.connect_failed(
                f"the repo's Docker daemon is not answering at {path} ({reason}); "
                f"start it with: rdc repo up {self.gate.repo_ref}"
            )
            return
        if self.exchange.closed:
            if protocol.transport is not None:
                protocol.transport.close()
            return
        self.upstream = protocol
        self.exchange.connected()

    # --- BuildKit's /grpc ------------------------------------------------------------------------
    def hand_to_relay(self, rest: bytes, client_ended: bool) -> None:
        self.relay = _Relay(self)
        if rest:
            self.relay.client_data(rest)
        if client_ended:
            self.relay.client_eof()
        self.relay.pump()

    def relay_upstream(self, data: bytes) -> None:
        assert self.relay is not None
        self.relay.upstream_data(data)


class _Relay:
    """BuildKit's `/grpc` on one connection after its 101: bytes both ways through a `GrpcRelay`,
    which checks each call; the connection closes once the relay is done."""

    __slots__ = ("client", "grpc")

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.grpc = GrpcRelay(self._judge, self._report)

    @property
    def held(self) -> int:
        return self.grpc.held

    def client_data(self, data: bytes) -> None:
        self.grpc.client_data(data)
        self.pump()

    def client_eof(self) -> None:
        self.grpc.client_eof()
        self.pump()

    def upstream_data(self, data: bytes) -> None:
        self.grpc.upstream_data(data)
        self.pump()

    def upstream_eof(self) -> None:
        self.grpc.upstream_eof()
        self.pump()

    def pump(self) -> None:
        """Send what the relay has for each side; close once it is done."""
        grpc, client = self.grpc, self.client
        to_client = grpc.for_client()
        if to_client:
            client.write(to_client)
        to_upstream = grpc.for_upstream()
        if to_upstream:
            client.send(to_upstream)
        if grpc.closed:
            client.close()
        elif grpc.held != client.held:
            client.account()

    def _judge(self, path: str, message: bytes) -> Verdict:
        return self.client.gate.decider.judge_grpc(path, message)

    def _report(self, path: str, status: int, message: str, rules: tuple[str, ...]) -> None:
        """A checked or refused gRPC call, for the gate's log and the audit trail."""
        gate = self.client.gate
        if status:
            gate.log(f"refused grpc-status {status} {path}: {message}")
        elif message:
            gate.log(f"admitted {path}: {message}")
        if gate.audit is not None:
            gate.audit.record(
                self.client.peer,
                "POST",
                f"/grpc{path}",
                status=403 if status else 200,
                endpoint="grpc",
                rules=rules,
                message=message if status else "",
            )


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
        self._routes: dict[tuple[str, str], tuple[Decision | None, Resolved | None]] = {}
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

    def route(self, method: str, target: str) -> tuple[Decision | None, Resolved | None]:
        """What a request's head alone decides: `head`'s refusal (or None) and, when its body is
        to be read and decided (`inspects`), the request resolved (target parsed, route found)
        for `decide`; None when the body streams.

        The answers of `head` and `inspects`, and the resolved request, are remembered: all three
        depend on nothing but their arguments (save for the routes decided by their query or governed
        by the drain mark, which the decider does not let be remembered), and the same few (method,
        target) pairs make up most of the traffic (`docker run` without a name posts to the same
        target every time). A `Resolved` is immutable, so one serves every request with that head.
        """
        key = (method, target)
        known = self._routes.get(key)
        if known is not None:
            return known
        request = self.decider.resolve(method, target)
        refused = self.decider.head(request)
        answer = (refused, request if refused is None and self.decider.inspects(request) else None)
        if self.decider.remembers(request):  # else decided by its query and the settings: asked every time
            if len(self._routes) >= _ROUTES_CACHE:
                self._routes.clear()
            self._routes[key] = answer
        return answer

    def decide(self, exchange: Exchange, req: RequestHead, request: Resolved, body: bytes) -> bool:
        """Decide on the loop when that cannot stall it, else in a worker thread; the answer goes
        to `exchange` (`decided`, or `undecided` when the decider raised). True when answered
        before returning, False when a worker decides.

        A small body takes a bounded fraction of a millisecond to decide, less than handing it
        to a thread and back. Anything that would wait (an image lookup on the daemon) raises
        `MustNotBlock` inside an inline decision, and the decision starts over in a worker.
        """
        if len(body) <= INLINE_DECISION_MAX:
            try:
                with decisions_must_not_block():
                    decision = self.decider.decide_resolved(request, req.content_type, body)
            except MustNotBlock:
                pass
            except Exception as exc:
                exchange.undecided(exc)
                return True
            else:
                exchange.decided(req, body, decision)
                return True
        self.spawn(self._decide_in_worker(exchange, req, request, body))
        return False

    async def _decide_in_worker(
        self, exchange: Exchange, req: RequestHead, request: Resolved, body: bytes
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            decision = await loop.run_in_executor(
                self.executor, self.decider.decide_resolved, request, req.content_type, body
            )
        except Exception as exc:
            exchange.undecided(exc)
            return
        exchange.decided(req, body, decision)

    def judged(self, peer: Peer, req: RequestHead, decision: Decision, started: float) -> None:
        """A decision, for the gate's log and the audit trail (`started`: when its head was read)."""
        for line in decision.log:
            self.log(line)
        if self.audit is not None:
            self.audit.record(
                peer,
                req.method,
                req.target,
                status=decision.status,
                endpoint=decision.endpoint,
                rules=decision.rules,
                cdi_asked=decision.cdi_asked,
                cdi_admitted=decision.cdi_admitted,
                message=decision.message,
                seconds=time.monotonic() - started,
            )

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
        for client in [c for c in self.connections if c.exchange.deadline and c.exchange.deadline < now]:
            client.exchange.expired()
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
