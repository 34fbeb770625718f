"""Where each HTTP/1.1 message starts and ends on one gate connection: bytes in, events out.

No sockets and no event loop here (the asyncio side is `server._Client`). Two framers, one per
direction, each a small state machine whose transitions are the tables below; the code moves
between states only through those tables (`REQUEST_TRANSITIONS`, `RESPONSE_TRANSITIONS`), and a
test checks that these docstring tables say the same as the data.

`RequestFramer.feed(data)` takes what a client sent and returns, in order:

- a `RequestHead` (parsed and validated, see `messages.parse_request_head`),
- body data: `bytes` or a `memoryview` of the decoded body (chunk framing removed), at most one
  per feed; a view may point into `data`, so it is used before the next read reuses that buffer,
- `END` once the request is complete,
- `ProtocolError` (status 400) for a request the gate cannot frame unambiguously.

An empty list means: feed more. After `END` the framer holds whatever follows (a pipelined
request) until `next_request()`, which frames it: one request at a time.

Request framer (what the client sends)::

    head          --head-without-body-->  complete
    head          --head-with-length--->  length-body
    head          --head-with-chunks--->  chunked-body
    head          --bad-head----------->  broken
    length-body   --body-end----------->  complete
    length-body   --switch------------->  tunnel
    chunked-body  --body-end----------->  complete
    chunked-body  --bad-chunk---------->  broken
    chunked-body  --switch------------->  tunnel
    complete      --next-request------->  head
    complete      --switch------------->  tunnel

`switch` and `next-request` come from the other direction: the daemon answered 101 (or with a
body that runs until it closes), or the response ended.

`ResponseFramer.feed(data)` takes what the daemon sent and returns, in order: the `ResponseHead`
of each head, the bytes to relay to the client (the daemon frames its answers and the gate
relays them as sent, head and body together where they arrived together), `END`, `TUNNEL` once
the connection carries raw bytes both ways (after the switching head, before the new protocol's
first bytes), and `ProtocolError` when the daemon's bytes cannot
be relayed safely (then the connection must close; status 502 when the client may still be
answered, 0 when part of the response is already out). `eof()` says what the daemon closing
the connection means in the current state.

Response framer (what the daemon sends)::

    idle          --request-sent------->  head
    idle          --surplus------------>  broken
    idle          --eof---------------->  idle
    head          --interim-head------->  head
    head          --head-without-body-->  idle
    head          --head-with-length--->  length-body
    head          --head-with-chunks--->  chunked-body
    head          --switching-head----->  tunnel
    head          --head-until-close--->  tunnel
    head          --bad-head----------->  broken
    head          --eof---------------->  broken
    length-body   --body-end----------->  idle
    length-body   --eof---------------->  broken
    chunked-body  --body-end----------->  idle
    chunked-body  --bad-chunk---------->  broken
    chunked-body  --eof---------------->  broken

`surplus` is a byte from the daemon with no request outstanding, including bytes after the end
of a complete response: the connection is no longer in step, so instead of that response's `END`
the framer reports a `ProtocolError`. `eof` while idle is a keep-alive connection the daemon let
go (the gate opens a new one for the next request).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rediacc_core.gate.http.messages import (
    BODY_LENGTH,
    BODY_NONE,
    BODY_UNTIL_CLOSE,
    INTERIM,
    MAX_HEAD,
    SWITCHED,
    ChunkedDecoder,
    FramingError,
    RequestHead,
    ResponseHead,
    find_head_end,
    known_request_head,
    parse_request_head,
    parse_response_head,
)

# States (strings: they compare and hash fast, and read well in logs and tests).
HEAD: Final = "head"
LENGTH_BODY: Final = "length-body"
CHUNKED_BODY: Final = "chunked-body"
COMPLETE: Final = "complete"
IDLE: Final = "idle"
TUNNEL_STATE: Final = "tunnel"
BROKEN: Final = "broken"


# A move a table lacks raises KeyError: a bug in the caller, never the peer's doing (a peer's bad
# bytes are a `bad-...` move to `broken`). Plain dicts: a lookup is on every message's path.
REQUEST_TRANSITIONS: Final[dict[str, dict[str, str]]] = {
    HEAD: {
        "head-without-body": COMPLETE,
        "head-with-length": LENGTH_BODY,
        "head-with-chunks": CHUNKED_BODY,
        "bad-head": BROKEN,
    },
    LENGTH_BODY: {"body-end": COMPLETE, "switch": TUNNEL_STATE},
    CHUNKED_BODY: {"body-end": COMPLETE, "bad-chunk": BROKEN, "switch": TUNNEL_STATE},
    COMPLETE: {"next-request": HEAD, "switch": TUNNEL_STATE},
    TUNNEL_STATE: {},
    BROKEN: {},
}

RESPONSE_TRANSITIONS: Final[dict[str, dict[str, str]]] = {
    IDLE: {"request-sent": HEAD, "surplus": BROKEN, "eof": IDLE},
    HEAD: {
        "interim-head": HEAD,
        "head-without-body": IDLE,
        "head-with-length": LENGTH_BODY,
        "head-with-chunks": CHUNKED_BODY,
        "switching-head": TUNNEL_STATE,
        "head-until-close": TUNNEL_STATE,
        "bad-head": BROKEN,
        "eof": BROKEN,
    },
    LENGTH_BODY: {"body-end": IDLE, "eof": BROKEN},
    CHUNKED_BODY: {"body-end": IDLE, "bad-chunk": BROKEN, "eof": BROKEN},
    TUNNEL_STATE: {},
    BROKEN: {},
}

_AFTER_END = "the daemon sent bytes after a complete response; closing the connection"
_UNASKED = "the daemon sent bytes with no request outstanding; closing the connection"
WHOLE_RESPONSE_MAX = 64 * 1024  # a read up to this size is tried as one whole response
WHOLE_HEAD_MAX = 4096  # a read up to this size is tried as one known request head


class EndOfMessage:
    """The message is complete (one instance, `END`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


class Tunnel:
    """From here on the connection carries raw bytes both ways (one instance, `TUNNEL`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TUNNEL"


END: Final = EndOfMessage()
TUNNEL: Final = Tunnel()


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """Bytes that cannot be framed: the connection must close.

    `status` is what to answer (400 to a client, 502 for the daemon; 0 when nothing can be
    answered because part of a response is already out); `rule` names the cause for the audit
    trail (`http`, `limit`, `upstream`).
    """

    status: int
    message: str
    rule: str = "http"


Data = bytes | memoryview
RequestEvent = RequestHead | Data | EndOfMessage | ProtocolError
ResponseEvent = ResponseHead | Data | EndOfMessage | Tunnel | ProtocolError


class RequestFramer:
    """Frames the requests one client sends (see the module docstring)."""

    __slots__ = ("_chunks", "_left", "held", "state")

    def __init__(self) -> None:
        self.state: str = HEAD
        # An unfinished head, or what follows a complete request (pipelined) until `next_request`;
        # the caller reads it (to count what it holds) and never changes it.
        self.held = bytearray()
        self._left = 0  # Content-Length bytes still to come
        self._chunks: ChunkedDecoder | None = None

    def feed(self, data: Data) -> Sequence[RequestEvent]:
        """Frame what the client sent next (see the module docstring for what comes back)."""
        state = self.state
        if state is HEAD:
            if not self.held:
                # The usual keep-alive case: one read holds exactly one whole head and nothing
                # else. Parse it straight from the read (one copy, which is also the parse
                # cache's key).
                chunk = bytes(data)
                end = chunk.find(b"\r\n\r\n")  # find_head_end, inlined: the hot path
                if end >= 0 and end + 4 == len(chunk):
                    return self._head(chunk)
                self.held += chunk
            else:
                self.held += data
            return self._frame_held()
        if state is LENGTH_BODY or state is CHUNKED_BODY:
            events: list[RequestEvent] = []
            used = self._body(data, events)  # nothing is held here: bodies are consumed as they come
            if used < len(data):
                self.held += memoryview(data)[used:]
            return events
        if state is COMPLETE:
            self.held += data
            return ()
        if state is TUNNEL_STATE:
            return (data,)
        return ()  # broken: nothing more is read

    def whole_request(self, data: Data) -> RequestHead | None:
        """The usual keep-alive read, framed in one step: when `data` is exactly one whole head of a
        request without a body, parsed before (`known_request_head`), the framer is complete as
        `feed` would leave it and the head comes back (`feed` would give it and `END`). None, with
        nothing changed, for anything else, which `feed` then frames.
        """
        if self.state is not HEAD or self.held or len(data) > WHOLE_HEAD_MAX:
            return None
        req = known_request_head(bytes(data))
        if req is None or req.chunked or req.content_length:
            return None
        self.state = REQUEST_TRANSITIONS[HEAD]["head-without-body"]
        return req

    def next_request(self) -> Sequence[RequestEvent]:
        """The exchange is over: frame the next request from what was held back."""
        self.state = REQUEST_TRANSITIONS[self.state]["next-request"]
        return self._frame_held() if self.held else ()

    def switch_to_tunnel(self) -> bytes:
        """The daemon switched protocols: returns what was held, to pass on raw."""
        self.state = REQUEST_TRANSITIONS[self.state]["switch"]
        rest = bytes(self.held)
        self.held.clear()
        return rest

    def _frame_held(self) -> list[RequestEvent]:
        events: list[RequestEvent] = []
        held = self.held
        while held:
            state = self.state
            if state is HEAD:
                end = find_head_end(held)
                if end < 0:
                    if len(held) > MAX_HEAD:
                        self.state = REQUEST_TRANSITIONS[self.state]["bad-head"]
                        too_long = f"request head larger than {MAX_HEAD} bytes"
                        events.append(ProtocolError(400, too_long, "limit"))
                    break
                head = bytes(held[:end])
                del held[:end]
                events += self._head(head)
            elif state is LENGTH_BODY or state is CHUNKED_BODY:
                data = bytes(held)
                held.clear()
                used = self._body(data, events)
                if used < len(data):
                    held += memoryview(data)[used:]
            else:
                break
        return events

    def _head(self, head: bytes) -> list[RequestEvent]:
        try:
            req = parse_request_head(head)
        except FramingError as exc:
            self.state = REQUEST_TRANSITIONS[self.state]["bad-head"]
            return [ProtocolError(exc.status, str(exc))]
        if req.chunked:
            self._chunks = ChunkedDecoder(strict=True)
            self.state = REQUEST_TRANSITIONS[self.state]["head-with-chunks"]
        elif req.content_length:
            self._left = req.content_length
            self.state = REQUEST_TRANSITIONS[self.state]["head-with-length"]
        else:
            self.state = REQUEST_TRANSITIONS[self.state]["head-without-body"]
            return [req, END]
        return [req]

    def _body(self, data: Data, events: list[RequestEvent]) -> int:
        """Consume body bytes from `data`; returns how many belonged to the body."""
        chunks = self._chunks
        if chunks is not None:
            try:
                pieces, used = chunks.feed(data)
            except FramingError as exc:
                self.state = REQUEST_TRANSITIONS[self.state]["bad-chunk"]
                events.append(ProtocolError(exc.status, str(exc)))
                return len(data)
            if pieces:
                events.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            if chunks.done:
                self._chunks = None
                self.state = REQUEST_TRANSITIONS[self.state]["body-end"]
                events.append(END)
            return used
        left = self._left
        used = min(left, len(data))
        if used:
            events.append(data if used == len(data) else memoryview(data)[:used])
        self._left = left - used
        if not self._left:
            self.state = REQUEST_TRANSITIONS[self.state]["body-end"]
            events.append(END)
        return used


class ResponseFramer:
    """Frames the daemon's responses on one client connection (see the module docstring).

    It outlives upstream connections: after an idle `eof` the next request may go out on a new one.
    """

    __slots__ = ("_chunks", "_held", "_left", "_method", "relayed", "state")

    def __init__(self) -> None:
        self.state: str = IDLE
        self._held = bytearray()  # an unfinished head
        self._left = 0  # Content-Length bytes still to come
        self._chunks: ChunkedDecoder | None = None
        self._method = "GET"
        self.relayed = False  # some byte of the current response was handed out to relay

    @property
    def under_way(self) -> bool:
        """Part of a response went to the client and the rest did not: no error can be answered."""
        return self.relayed and self.state is not IDLE

    def request_sent(self, method: str) -> None:
        """A request went to the daemon: its response is next (`method` decides HEAD's framing)."""
        self.state = RESPONSE_TRANSITIONS[self.state]["request-sent"]  # from idle, where nothing is held
        self._method = method
        self.relayed = False

    def feed(self, data: Data) -> Sequence[ResponseEvent]:
        """Frame what the daemon sent next (see the module docstring for what comes back)."""
        state = self.state
        if state is HEAD:
            if not self._held and len(data) <= WHOLE_RESPONSE_MAX:
                chunk = bytes(data)
                whole = self._whole_response(chunk)
                if whole is not None:
                    return whole
                self._held += chunk
            else:
                self._held += data
            return self._heads()
        if state is LENGTH_BODY or state is CHUNKED_BODY:
            events: list[ResponseEvent] = []
            self._body(data, b"", events)
            return events
        if state is TUNNEL_STATE:
            return (data,)
        if state is IDLE:
            events = []
            self._surplus(_UNASKED, events)
            return events
        return ()  # broken: nothing more is read

    def whole(self, data: Data) -> tuple[ResponseHead, bytes] | None:
        """The usual keep-alive answer framed in one step: when `data` is one whole response (a head
        and exactly its body), its head and its bytes, to relay as read, and the framer idle as
        `feed` would leave it (`feed` would give the head, the bytes and `END`). None, with nothing
        changed, for anything else, which `feed` then frames.
        """
        if self.state is not HEAD or self._held or len(data) > WHOLE_RESPONSE_MAX:
            return None
        chunk = bytes(data)
        whole = self._whole_response(chunk)
        return None if whole is None else (whole[0], chunk)

    def eof(self, how: str = "closed") -> ProtocolError | None:
        """The daemon ended the connection (`how`: closed or dropped); None when that is harmless."""
        state = self.state
        self.state = RESPONSE_TRANSITIONS[self.state]["eof"]
        if state is IDLE:
            return None
        if state is HEAD and not self.relayed:
            unanswered = f"the repo's Docker daemon {how} the connection without answering"
            return ProtocolError(502, unanswered, "upstream")
        cut = f"the repo's Docker daemon {how} the connection in the middle of a response"
        return ProtocolError(0, cut, "upstream")

    def _whole_response(self, chunk: bytes) -> tuple[ResponseHead, bytes, EndOfMessage] | None:
        """The usual keep-alive answer, one read holding a head and exactly its body: relayed as read.

        None (nothing done) for everything else, which `_heads` then frames.
        """
        end = chunk.find(b"\r\n\r\n") + 4  # find_head_end, inlined: the hot path
        if end < 4:
            return None
        try:
            resp = parse_response_head(chunk[:end], self._method)
        except ValueError:
            return None
        body = len(chunk) - end
        if resp.body == BODY_LENGTH and resp.length == body:
            self.state = RESPONSE_TRANSITIONS[self.state]["head-with-length"]
            self.state = RESPONSE_TRANSITIONS[self.state]["body-end"]
        elif resp.body == BODY_NONE and not body:
            self.state = RESPONSE_TRANSITIONS[self.state]["head-without-body"]
        else:
            return None
        self.relayed = True
        return (resp, chunk, END)

    def _heads(self) -> list[ResponseEvent]:
        events: list[ResponseEvent] = []
        held = self._held
        while self.state is HEAD:
            end = find_head_end(held)
            if end < 0:
                if len(held) > MAX_HEAD:
                    self.state = RESPONSE_TRANSITIONS[self.state]["bad-head"]
                    too_long = "the daemon sent a response head that is too large"
                    events.append(ProtocolError(502, too_long, "upstream"))
                return events
            head = bytes(held[:end])
            rest = bytes(held[end:])
            held.clear()
            try:
                resp = parse_response_head(head, self._method)
            except ValueError as exc:
                self.state = RESPONSE_TRANSITIONS[self.state]["bad-head"]
                events.append(ProtocolError(502, str(exc), "upstream"))
                return events
            self.relayed = True
            events.append(resp)
            kind = resp.body
            if kind == INTERIM:
                self.state = RESPONSE_TRANSITIONS[self.state]["interim-head"]
                events.append(head)
                held += rest
                continue
            if kind in (SWITCHED, BODY_UNTIL_CLOSE):
                # 101, or a hijacked stream without an upgrade (old clients): raw bytes both ways.
                how = "switching-head" if kind == SWITCHED else "head-until-close"
                self.state = RESPONSE_TRANSITIONS[self.state][how]
                events.append(head)
                events.append(TUNNEL)
                if rest:  # the new protocol's first bytes: its relay may not be a raw one (/grpc)
                    events.append(rest)
                return events
            if kind == BODY_NONE:
                self.state = RESPONSE_TRANSITIONS[self.state]["head-without-body"]
                events.append(head)
                if rest:
                    self._surplus(_AFTER_END, events)
                else:
                    events.append(END)
                return events
            if kind == BODY_LENGTH:
                self._left = resp.length
                self.state = RESPONSE_TRANSITIONS[self.state]["head-with-length"]
            else:
                self._chunks = ChunkedDecoder(strict=False)
                self.state = RESPONSE_TRANSITIONS[self.state]["head-with-chunks"]
            self._body(rest, head, events)  # head and body in one write: one syscall
        return events

    def _body(self, data: Data, head: bytes, events: list[ResponseEvent]) -> None:
        """Relay body bytes from `data` (after `head`, when the head came in the same read)."""
        chunks = self._chunks
        if chunks is not None:
            try:
                _, used = chunks.feed(data)
            except FramingError as exc:
                # The whole chunks before the bad line go out: the client sees the body cut there.
                good = memoryview(data)[: exc.valid]
                if head or good:
                    events.append(head + good if head else good)
                self.state = RESPONSE_TRANSITIONS[self.state]["bad-chunk"]
                events.append(ProtocolError(0, f"bad chunked response from the daemon: {exc}", "upstream"))
                return
            part = data if used == len(data) else memoryview(data)[:used]
            if head or part:
                events.append(head + part if head else part)
            if chunks.done:
                self._chunks = None
                self.state = RESPONSE_TRANSITIONS[self.state]["body-end"]
                if used < len(data):
                    self._surplus(_AFTER_END, events)
                else:
                    events.append(END)
            return
        left = self._left
        if len(data) <= left:
            if head or data:
                events.append(head + data if head else data)
            self._left = left - len(data)
            if not self._left:
                self.state = RESPONSE_TRANSITIONS[self.state]["body-end"]
                events.append(END)
            return
        events.append(head + memoryview(data)[:left])
        self._left = 0
        self.state = RESPONSE_TRANSITIONS[self.state]["body-end"]
        self._surplus(_AFTER_END, events)

    def _surplus(self, message: str, events: list[ResponseEvent]) -> None:
        self.state = RESPONSE_TRANSITIONS[self.state]["surplus"]
        events.append(ProtocolError(0, message, "upstream"))
