"""One gate connection's HTTP/1.1 exchange: what the two framers' events mean together.

No sockets and no event loop here (the asyncio side is `server._Client`, which performs the
actions). The framers (`framing`) say where each message starts and ends; an `Exchange` owns what
follows from both directions at once, as h11's `ConnectionState` does: lockstep (one request, then
its whole response), 100-continue, a body refused from its head (read and dropped), a body read
whole for the decider, the next (pipelined) request, close-after, half-close, the upstream
connection being made (and the request bytes held meanwhile), the switch to a raw tunnel or to
BuildKit's gRPC relay, and the deadlines of an unfinished head or inspected body.

Events come in as method calls (`client_data`, `client_ended`, `upstream_data`, `upstream_ended`,
`upstream_lost`, `connected`, `connect_failed`, `decided`, `undecided`, `expired`, `fail`);
actions go out as calls on the `Performer` the exchange was given (write to the client, send to
the daemon, connect, decide, pause or resume reading with a reason, relay, recount what is held,
record a refusal, close). Actions are calls rather than returned objects so that the streaming
path allocates nothing per read: body bytes go straight from the framer to `write` or `send`.

The exchange moves between phases only through `PHASES`, and the upstream connection between its
states only through `UPSTREAM` (a test checks that these docstring tables say the same as the data).

Phases of the request in progress::

    idle       --refused-head---->  dropping
    idle       --inspected-head-->  reading
    idle       --passed-head----->  forwarded
    idle       --close----------->  closed
    dropping   --request-end----->  deciding
    dropping   --close----------->  closed
    reading    --request-end----->  deciding
    reading    --close----------->  closed
    deciding   --answered-------->  idle
    deciding   --admitted-------->  forwarded
    deciding   --close----------->  closed
    forwarded  --exchange-end---->  idle
    forwarded  --switch---------->  tunnel
    forwarded  --grpc-switch----->  relay
    forwarded  --close----------->  closed
    tunnel     --close----------->  closed
    relay      --close----------->  closed
    closed     --close----------->  closed

`dropping` reads the body of a request refused from its head (clients write the whole body before
they read the answer); the refusal is then its decision. `reading` holds an inspected body for the
decider. `forwarded` lasts until both the request and its response have ended (the daemon may
answer before the body is all sent). `answered` is a refusal or the gate's own answer on a
connection that stays open; one that must close moves by `close`. `tunnel` carries raw bytes both
ways after a `101` or a hijacked stream; `relay` is BuildKit's `/grpc`, handed to the gRPC relay.

The daemon's connection::

    none        --connect--------->  connecting
    connecting  --connected------->  open
    connecting  --connect-failed-->  none
    open        --idle-eof-------->  none
    open        --lost------------>  none

It is opened by the first request forwarded and again after the daemon let an idle one go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final, Protocol

from rediacc_core.gate.decide.decision import Answer, Decision, Forward
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

PIPELINE_LIMIT = 1024 * 1024  # client bytes held while a response is pending
JOIN_MAX = 64 * 1024  # a decided head and body go out in one write up to this size

# Phases and upstream states (strings: they compare fast and read well in tests).
WAITING: Final = "idle"
DROPPING: Final = "dropping"
READING: Final = "reading"
DECIDING: Final = "deciding"
FORWARDED: Final = "forwarded"
TUNNELLED: Final = "tunnel"
RELAYED: Final = "relay"
CLOSED: Final = "closed"
NONE: Final = "none"
CONNECTING: Final = "connecting"
OPEN: Final = "open"

# A move a table lacks raises KeyError: a bug in the exchange, never a peer's doing.
PHASES: Final[dict[str, dict[str, str]]] = {
    WAITING: {
        "refused-head": DROPPING,
        "inspected-head": READING,
        "passed-head": FORWARDED,
        "close": CLOSED,
    },
    DROPPING: {"request-end": DECIDING, "close": CLOSED},
    READING: {"request-end": DECIDING, "close": CLOSED},
    DECIDING: {"answered": WAITING, "admitted": FORWARDED, "close": CLOSED},
    FORWARDED: {"exchange-end": WAITING, "switch": TUNNELLED, "grpc-switch": RELAYED, "close": CLOSED},
    TUNNELLED: {"close": CLOSED},
    RELAYED: {"close": CLOSED},
    CLOSED: {"close": CLOSED},
}

UPSTREAM: Final[dict[str, dict[str, str]]] = {
    NONE: {"connect": CONNECTING},
    CONNECTING: {"connected": OPEN, "connect-failed": NONE},
    OPEN: {"idle-eof": NONE, "lost": NONE},
}


class Performer(Protocol):
    """The actions an exchange asks for; the asyncio glue performs them (tests record them)."""

    held: int  # bytes of this connection counted against the gate's limit (see `account`)

    def route(self, method: str, target: str) -> tuple[Decision | None, bool]:
        """What a head alone decides: a refusal (or None) and whether the body is inspected."""

    def write(self, data: Data) -> None:
        """To the client (dropped once the connection is closed)."""

    def send(self, data: Data) -> None:
        """To the daemon, whose connection is open."""

    def connect(self) -> None:
        """Open the daemon's connection; answer with `connected` or `connect_failed`."""

    def decide(self, req: RequestHead, body: bytes) -> None:
        """Decide `req` with `body`, inline or in a worker; answer with `decided` or `undecided`."""

    def judged(self, req: RequestHead, decision: Decision) -> None:
        """A decision was made: log it and write it to the audit trail."""

    def pause(self, reason: str) -> None:
        """Stop reading the client until `resume(reason)` (reasons add up)."""

    def resume(self, reason: str) -> None: ...

    def hand_to_relay(self, rest: bytes, client_ended: bool) -> None:
        """Hand the connection to BuildKit's gRPC relay, with the client bytes read past the 101."""

    def relay_upstream(self, data: bytes) -> None:
        """The daemon's first gRPC bytes, read with its 101."""

    def end_upstream(self) -> None:
        """Half-close toward the daemon (the client ended; its output keeps flowing)."""

    def end_client(self) -> None:
        """Half-close toward the client."""

    def drop_upstream(self) -> None:
        """Close the daemon's connection only (an idle one it let go)."""

    def account(self) -> None:
        """Recount what the connection holds (`Exchange.holding`) against the gate's limit."""

    def refused(self, status: int, message: str, rule: str) -> None:
        """Log and audit a refusal the exchange answers itself (framing, limit, upstream, gate)."""

    def log(self, line: str) -> None: ...

    def close(self, first: bool) -> None:
        """Flush what is queued to the client, then close both sides (`first`: not closed before)."""


def status_of(exc: BaseException) -> int:
    """What to answer for a decider's exception: its `status` when it has one, else 500."""
    status = getattr(exc, "status", None)
    return status if isinstance(status, int) and 400 <= status < 600 else 500


def message_of(exc: BaseException) -> str:
    if status_of(exc) == 500:
        what = f"{type(exc).__name__}: {exc}"
        return f"the gate could not decide on this request ({what}); nothing was forwarded"
    return str(exc)


def grpc_upgrade(req: RequestHead | None) -> bool:
    """Is `req` BuildKit's `/grpc` upgrade, whose connection the gate relays call by call?"""
    if req is None or req.method != "POST":
        return False
    path = req.target.partition("?")[0]
    return path == "/grpc" or (path.startswith("/v") and path.endswith("/grpc") and path.count("/") == 2)


class _DaemonSide:
    """The joint state of one client connection, and what the daemon's side does to it;
    `Exchange` adds the client's side (two classes, one object: see the module docstring)."""

    __slots__ = (
        "body_timeout",
        "client_eof",
        "clock",
        "close_after",
        "closed",
        "deadline",
        "framing",
        "head_timeout",
        "inspect",
        "io",
        "next_due",
        "phase",
        "refusal",
        "req",
        "requests",
        "responses",
        "started",
        "unsent",
        "upstream",
        "upstream_eof",
    )

    def __init__(
        self,
        io: Performer,
        *,
        head_timeout: float,
        body_timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.io = io
        self.head_timeout = head_timeout
        self.body_timeout = body_timeout
        self.clock = clock
        self.requests = RequestFramer()
        self.responses = ResponseFramer()
        self.phase: str = WAITING
        self.upstream: str = NONE
        self.unsent: list[bytes] | None = None  # request bytes held while the upstream connects
        self.req: RequestHead | None = None  # the request being served
        self.refusal: Decision | None = None  # its refusal, answered once its body is dropped
        self.inspect: bytearray | None = None  # its body, read whole for the decider
        self.close_after = False  # the response in progress ends the connection
        self.client_eof = False
        self.upstream_eof = False
        self.closed = False
        self.framing = False  # inside `_frame`: a finished exchange lets it frame the next request
        self.next_due = False  # an exchange ended inside `_frame`: it frames the next request
        self.deadline = 0.0  # clock time by which the head or inspected body must be in (0: none)
        self.started = 0.0  # when the head of the request being decided was read

    def holding(self) -> int:
        """Bytes of unfinished requests held: an unfinished head, an inspected body, unsent bytes."""
        held = len(self.requests.held)
        if self.inspect is not None:
            held += len(self.inspect)
        if self.unsent:
            held += sum(len(part) for part in self.unsent)
        return held

    def _framed(self) -> None:
        """After the framer's events: a deadline for an unfinished head, a pause for a long
        pipeline, and what the connection holds recounted."""
        if self.closed:
            return
        requests = self.requests
        pending = requests.held
        if requests.state is HEAD:
            if pending and not self.deadline:
                self.deadline = self.clock() + self.head_timeout
        elif requests.state is COMPLETE and len(pending) > PIPELINE_LIMIT:
            self.io.pause("pipeline")
        if pending or self.io.held or self.inspect is not None or self.unsent:
            self.io.account()

    def _move(self, event: str) -> None:
        self.phase = PHASES[self.phase][event]

    # --- events from the glue: the daemon's side, and the end of the connection ----------------
    def upstream_data(self, data: Data) -> None:
        if self.phase is TUNNELLED:
            self.io.write(data)
            return
        if self.closed:
            return
        if self.phase is FORWARDED:
            whole = self.responses.whole(data)
            if whole is not None:  # the usual keep-alive answer: one read, relayed as read
                resp, chunk = whole
                req = self.req
                self.close_after = not resp.keep_alive or (req is not None and not req.keep_alive)
                self.io.write(chunk)
                self._response_complete()
                return
        # Only the last event of a read can close the connection (an end, or an error), so unlike
        # `_frame` this loop need not look for a close between events.
        io = self.io
        for event in self.responses.feed(data):
            if type(event) is bytes or type(event) is memoryview:
                if self.phase is RELAYED:  # the daemon's first HTTP/2 bytes, read with its 101
                    io.relay_upstream(bytes(event))
                else:
                    io.write(event)
            elif event is END:
                self._response_complete()
            elif type(event) is ResponseHead:
                req = self.req
                self.close_after = not event.keep_alive or (req is not None and not req.keep_alive)
            elif event is TUNNEL:
                self._tunnel()
            elif type(event) is ProtocolError:
                self._response_failed(event)

    def upstream_ended(self) -> bool:
        """The daemon half-closed; True keeps the connection open (a tunnel's other half)."""
        self.upstream_eof = True
        phase = self.phase
        if phase is RELAYED:
            return False
        if phase is TUNNELLED:
            if not self.closed:
                self.io.end_client()
            if self.client_eof:
                self.close()
            return True
        if self.closed:
            return False
        failure = self.responses.eof("closed")
        if failure is None:  # an idle keep-alive connection the daemon let go; reopened on demand
            self.upstream = UPSTREAM[self.upstream]["idle-eof"]
            self.io.drop_upstream()
        else:
            self._response_failed(failure)
        return False

    def upstream_lost(self) -> None:
        self.upstream = UPSTREAM[self.upstream]["lost"]
        if self.phase is TUNNELLED or self.phase is RELAYED:
            self.close()
        elif not self.closed:
            failure = self.responses.eof("dropped")
            if failure is not None:
                self._response_failed(failure)

    def connected(self) -> None:
        self.upstream = UPSTREAM[self.upstream]["connected"]
        self.upstream_eof = False
        unsent, self.unsent = self.unsent or [], None
        for data in unsent:
            self.io.send(data)
        self.io.resume("connect")
        if self.io.held:
            self.io.account()

    def connect_failed(self, message: str) -> None:
        self.upstream = UPSTREAM[self.upstream]["connect-failed"]
        self.unsent = None
        self.fail(502, message, "upstream")

    def fail(self, status: int, message: str, rule: str = "http") -> None:
        """Answer with an error and close: the connection cannot be resynchronised.

        `rule` names the cause in the audit trail: `http` (framing), `limit`, `upstream`, `gate`.
        """
        head_only = self.req is not None and self.req.method == "HEAD"
        self.io.refused(status, message, rule)
        if not self.responses.under_way and not self.closed:  # never inside a response under way
            self.io.write(error_response(status, message, head_only=head_only, close=True))
        self.close()

    def close(self) -> None:
        first = not self.closed
        self.closed = True
        self.deadline = 0.0
        self.phase = PHASES[self.phase]["close"]
        self.io.close(first)

    def lost(self) -> None:
        """The client's connection is gone."""
        self.closed = True
        self.deadline = 0.0
        self.phase = PHASES[self.phase]["close"]

    # --- the daemon's answers -------------------------------------------------------------------
    def _response_failed(self, error: ProtocolError) -> None:
        if error.status:
            self.fail(error.status, error.message, error.rule)
        else:  # part of the response is out: the client must see it cut, not a truncated success
            self.io.log(error.message)
            self.close()

    def _response_complete(self) -> None:
        if self.close_after or self.client_eof:
            self.close()
            return
        if self.requests.state is COMPLETE:
            self._done("exchange-end")
        # else: the daemon answered before the body was all sent; the rest still streams, and
        # the request's end finishes the exchange.

    def _tunnel(self) -> None:
        rest = self.requests.switch_to_tunnel()
        if grpc_upgrade(self.req):
            self._move("grpc-switch")
            self.io.hand_to_relay(rest, self.client_eof)
        else:
            self._move("switch")
            if rest:
                self._to_upstream(rest)
            if self.client_eof and self.upstream is OPEN:
                self.io.end_upstream()
        self.io.resume("pipeline")

    def _to_upstream(self, data: Data) -> None:
        """Pass bytes to the daemon; held (copied) while a connection to it is being made."""
        if self.upstream is OPEN:
            self.io.send(data)
        elif self.unsent is not None:
            self.unsent.append(bytes(data))

    def _connect_soon(self) -> None:
        """Open the daemon's connection for a request; what is written meanwhile is held and the
        client read no further. Only a request opens one: bytes after a lost one are dropped."""
        self.upstream = UPSTREAM[self.upstream]["connect"]
        self.unsent = []
        self.io.pause("connect")
        self.io.connect()

    def _done(self, move: str) -> None:
        raise NotImplementedError  # the client's side: `Exchange._done`


class Exchange(_DaemonSide):
    """One client connection's joint HTTP/1.1 state (see the module docstring)."""

    __slots__ = ()

    # --- events from the glue: the client's side -------------------------------------------------
    def client_data(self, data: Data) -> None:
        phase = self.phase
        if phase is WAITING and self.upstream is OPEN:
            req = self.requests.whole_request(data)
            if req is not None:
                self._whole_request(req)
                return
        if phase is TUNNELLED:
            self._to_upstream(data)
        else:
            self._frame(self.requests.feed(data))

    def client_ended(self) -> bool:
        """The client half-closed; True keeps the connection open for what is still owed."""
        self.client_eof = True
        phase = self.phase
        if phase is RELAYED:
            return False
        if phase is TUNNELLED:
            if self.upstream is OPEN:
                self.io.end_upstream()  # stdin ended: the container sees EOF, output keeps flowing
            if self.upstream_eof:
                self.close()
            return True
        if self.requests.state is COMPLETE:
            return True  # answer what was asked, then close
        self.close()
        return False

    def decided(self, req: RequestHead, body: bytes, decision: Decision) -> None:
        io = self.io
        io.judged(req, decision)
        if self.closed:
            return
        if isinstance(decision, Forward):
            self._send_decided(req, body if decision.body is None else decision.body)
            return
        closing = not req.keep_alive
        if isinstance(decision, Answer):  # the gate's own answer (`views`), not a refusal
            io.write(json_response(decision.answer, close=closing))
        else:
            if not decision.log:
                io.log(f"refused {decision.status} {req.method} {req.target}: {decision.message}")
            head_only = req.method == "HEAD"
            io.write(error_response(decision.status, decision.message, head_only=head_only, close=closing))
        if closing:
            self.close()
            return
        io.resume("decide")
        self._done("answered")

    def undecided(self, exc: BaseException) -> None:
        """The decider raised: answered with its status (500 for a bug) and closed."""
        self.fail(status_of(exc), message_of(exc), "gate")

    def expired(self) -> None:
        """The deadline passed: drop the unfinished request."""
        what, limit = ("head", self.head_timeout)
        if self.requests.state is not HEAD:
            what, limit = ("body", self.body_timeout)
        self.fail(
            408,
            f"the request {what} did not arrive within {limit:g} s; the gate closed the connection",
            "limit",
        )

    def _whole_request(self, req: RequestHead) -> None:
        """A request without a body read whole, on an open daemon connection (the usual keep-alive
        read): what `_frame((req, END))` does, with the common case, a request passed on by its
        head, done here in a few steps."""
        self.req = req
        self.deadline = 0.0
        try:
            refused, inspected = self.io.route(req.method, req.target)
        except Exception as exc:
            self.undecided(exc)
            return
        if refused is None and not inspected:
            # `_routed`'s passed head and `_request_complete` with the response still to come;
            # nothing is held (the framer held nothing, the connection is open).
            self.inspect = None
            self.phase = PHASES[WAITING]["passed-head"]
            self.responses.request_sent(req.method)
            self.io.send(req.passthrough)
            if self.io.held:
                self.io.account()
            return
        self.framing = True
        try:
            self._routed(req, refused, inspected)
            if not self.closed:
                self._request_complete()
        finally:
            self.framing = False
        if self.next_due and not self.closed:
            self.next_due = False
            self._frame(self.requests.next_request())
        else:
            self._framed()

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
                        self.fail(event.status, event.message, event.rule)
                if not self.next_due or self.closed:
                    break
                self.next_due = False
                events = self.requests.next_request()
        finally:
            self.framing = False
        self._framed()

    def _start_request(self, req: RequestHead) -> None:
        self.req = req
        self.deadline = 0.0
        try:
            refused, inspected = self.io.route(req.method, req.target)
        except Exception as exc:
            self.undecided(exc)
            return
        self._routed(req, refused, inspected)

    def _routed(self, req: RequestHead, refused: Decision | None, inspected: bool) -> None:
        """What a head's route says: drop its body (refused), read it for the decider, or pass on."""
        if refused is not None:
            self.refusal = refused
            self.inspect = None
            self._move("refused-head")
            return
        if inspected:
            self.inspect = bytearray()
            self.started = self.clock()
            self._move("inspected-head")
            if req.has_body:
                if req.expect_continue:
                    self.io.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.deadline = self.started + self.body_timeout
            return
        self.inspect = None
        self._move("passed-head")
        self.responses.request_sent(req.method)
        if self.upstream is NONE:
            self._connect_soon()
        self._to_upstream(req.passthrough)

    def _body_data(self, data: Data) -> None:
        phase = self.phase
        if phase is DROPPING:
            return  # the body of a refused request: read and dropped
        inspect = self.inspect
        if inspect is not None:
            inspect += data
            if len(inspect) > MAX_INSPECTED_BODY:
                self.fail(
                    400,
                    f"request body larger than {MAX_INSPECTED_BODY // (1024 * 1024)} MiB: "
                    "the gate reads container and volume requests whole and refuses bigger ones",
                    "limit",
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
        refusal = self.refusal
        if refusal is not None:
            self.refusal = None
            self._move("request-end")
            self.decided(req, b"", refusal)
            return
        if self.inspect is not None:
            body = bytes(self.inspect)
            self.inspect = None
            self.deadline = 0.0
            self._move("request-end")
            self.io.account()
            self.io.pause("decide")
            self.io.decide(req, body)
            return
        if req.chunked:
            self._to_upstream(LAST_CHUNK)
        if self.responses.state is IDLE:  # the response already finished (an early answer)
            self._done("exchange-end")
        # else the response is on its way; its end finishes the exchange

    def _send_decided(self, req: RequestHead, forwarded: bytes) -> None:
        """Forward a decided request: the head with the gate's Content-Length, then the canonical body."""
        self._move("admitted")
        self.responses.request_sent(req.method)
        if self.upstream is NONE:
            self._connect_soon()
        framed = req.has_body or bool(forwarded)
        head = req.encode(content_length=len(forwarded) if framed else None, chunked=False)
        self._to_upstream(head + forwarded if len(forwarded) <= JOIN_MAX else head)
        if len(forwarded) > JOIN_MAX:
            self._to_upstream(forwarded)
        self.io.resume("decide")

    def _done(self, move: str) -> None:
        """The request and its answer are over: on to the next request, or close."""
        if self.closed:
            return
        self._move(move)
        self.req = None
        if self.client_eof:
            self.close()
            return
        self.io.resume("pipeline")
        if self.framing:
            self.next_due = True  # `_frame` goes on with the next request: a loop, not recursion
            return
        events = self.requests.next_request()
        if events or self.requests.held or self.io.held:
            self._frame(events)
