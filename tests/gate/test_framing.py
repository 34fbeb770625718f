"""The gate's framers, without sockets: each case feeds bytes (or says what the other side did) and
lists the events that must come back and the transitions taken on the way.

The cases together take every transition in the two tables (checked below), and the module
docstring's tables are checked against the data the framers use.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from transitions_kit import Transition, docstring_rows, recording, table_rows

from rediacc_core.gate.http import framing
from rediacc_core.gate.http.framing import (
    END,
    REQUEST_TRANSITIONS,
    RESPONSE_TRANSITIONS,
    TUNNEL,
    WHOLE_RESPONSE_MAX,
    ProtocolError,
    RequestFramer,
    ResponseFramer,
)
from rediacc_core.gate.http.messages import MAX_HEAD, RequestHead, ResponseHead


def shown(event: Any) -> tuple[Any, ...]:
    """An event as the cases write it."""
    if isinstance(event, RequestHead):
        return ("head", event.method, event.target)
    if isinstance(event, ResponseHead):
        return ("head", event.status)
    if event is END:
        return ("end",)
    if event is TUNNEL:
        return ("tunnel",)
    if isinstance(event, ProtocolError):
        return ("error", event.status, event.rule)
    assert isinstance(event, bytes | memoryview), event
    return ("data", bytes(event))


def req(*lines: str, body: bytes = b"") -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


GET_PING = req("GET /_ping HTTP/1.1", "Host: docker")
POST_3 = req("POST /x HTTP/1.1", "Host: docker", "Content-Length: 3")
POST_CHUNKED = req("POST /build HTTP/1.1", "Host: docker", "Transfer-Encoding: chunked")
EXEC_START = req(
    "POST /exec/e1/start HTTP/1.1", "Connection: Upgrade", "Upgrade: tcp", "Content-Length: 2", body=b"{}"
)
OK_2 = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
CHUNKED_OK = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


# --- steps ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """A call on the framer besides `feed`: what the other direction or the connection did."""

    name: str
    arg: str | None = None


NEXT = Call("next_request")
SWITCH = Call("switch_to_tunnel")
Step = bytes | Call


def sent(method: str = "GET") -> Call:
    return Call("request_sent", method)


def eof(how: str = "closed") -> Call:
    return Call("eof", how)


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]
    events: tuple[tuple[Any, ...], ...]
    taken: tuple[Transition, ...]
    said: str = ""  # a piece of the error message, when there is one
    as_views: bool = False  # feed memoryviews, as the server does
    ends_in: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def run_request_case(case: Case) -> tuple[RequestFramer, list[Any], list[Transition]]:
    framer = RequestFramer()
    events: list[Any] = []
    with recording(framing, "REQUEST_TRANSITIONS", "RESPONSE_TRANSITIONS") as taken:
        for step in case.steps:
            run_request_step(framer, step, case.as_views, events)
    return framer, events, taken


def run_request_step(framer: RequestFramer, step: Step, as_views: bool, events: list[Any]) -> None:
    if isinstance(step, bytes):
        events += framer.feed(memoryview(bytearray(step)) if as_views else step)
    elif step.name == "next_request":
        events += framer.next_request()
    else:
        events.append(("held", framer.switch_to_tunnel()))


def run_response_case(case: Case) -> tuple[ResponseFramer, list[Any], list[Transition]]:
    framer = ResponseFramer()
    events: list[Any] = []
    with recording(framing, "REQUEST_TRANSITIONS", "RESPONSE_TRANSITIONS") as taken:
        for step in case.steps:
            if isinstance(step, bytes):
                events += framer.feed(memoryview(bytearray(step)) if case.as_views else step)
            elif step.name == "request_sent":
                framer.request_sent(step.arg or "GET")
            else:
                failure = framer.eof(step.arg or "closed")
                events.append(("eof", None if failure is None else shown(failure)))
    return framer, events, taken


def rendered(events: Iterable[Any]) -> tuple[tuple[Any, ...], ...]:
    return tuple(event if isinstance(event, tuple) else shown(event) for event in events)


def messages(events: list[Any]) -> str:
    return " | ".join(event.message for event in events if isinstance(event, ProtocolError))


# The states, short, so that a case's transitions fit on a line.
H, L, C, DONE, T, B, IDLE = "head", "length-body", "chunked-body", "complete", "tunnel", "broken", "idle"

REQUEST_CASES = [
    Case(
        "a bodiless request in one read",
        (GET_PING,),
        (("head", "GET", "/_ping"), ("end",)),
        ((H, "head-without-body", DONE),),
        as_views=True,
    ),
    Case(
        "a head dripped in over three reads, the first shorter than a blank line",
        (GET_PING[:3], GET_PING[3:20], GET_PING[20:]),
        (("head", "GET", "/_ping"), ("end",)),
        ((H, "head-without-body", DONE),),
    ),
    Case(
        "a Content-Length body in the head's read",
        (POST_3 + b"abc",),
        (("head", "POST", "/x"), ("data", b"abc"), ("end",)),
        ((H, "head-with-length", L), (L, "body-end", DONE)),
        as_views=True,
    ),
    Case(
        "a Content-Length body in later reads, a byte at a time",
        (POST_3, b"a", b"b", b"c"),
        (("head", "POST", "/x"), ("data", b"a"), ("data", b"b"), ("data", b"c"), ("end",)),
        ((H, "head-with-length", L), (L, "body-end", DONE)),
        as_views=True,
    ),
    Case(
        "a body and the pipelined request behind it in one read",
        (POST_3 + b"abc" + GET_PING, NEXT),
        (("head", "POST", "/x"), ("data", b"abc"), ("end",), ("head", "GET", "/_ping"), ("end",)),
        (
            (H, "head-with-length", L),
            (L, "body-end", DONE),
            (DONE, "next-request", H),
            (H, "head-without-body", DONE),
        ),
    ),
    Case(
        "a body that ends inside the read that carries the next request",
        (POST_3, b"abc" + GET_PING[:10], GET_PING[10:], NEXT),
        (("head", "POST", "/x"), ("data", b"abc"), ("end",), ("head", "GET", "/_ping"), ("end",)),
        (
            (H, "head-with-length", L),
            (L, "body-end", DONE),
            (DONE, "next-request", H),
            (H, "head-without-body", DONE),
        ),
        as_views=True,
    ),
    Case(
        "two pipelined requests: the second waits for the first exchange to end",
        (GET_PING + GET_PING, NEXT, NEXT),
        (("head", "GET", "/_ping"), ("end",), ("head", "GET", "/_ping"), ("end",)),
        (
            (H, "head-without-body", DONE),
            (DONE, "next-request", H),
            (H, "head-without-body", DONE),
            (DONE, "next-request", H),
        ),
    ),
    Case(
        "a chunked body, its chunks decoded and each read's pieces joined",
        (POST_CHUNKED, b"3\r\nabc\r\n2\r\nde\r\n", b"1\r\nf\r\n0\r\n\r\n"),
        (("head", "POST", "/build"), ("data", b"abcde"), ("data", b"f"), ("end",)),
        ((H, "head-with-chunks", C), (C, "body-end", DONE)),
        as_views=True,
    ),
    Case(
        "a chunked body in the head's read, the next request behind it",
        (POST_CHUNKED + b"3\r\nabc\r\n0\r\n\r\n" + GET_PING, NEXT),
        (("head", "POST", "/build"), ("data", b"abc"), ("end",), ("head", "GET", "/_ping"), ("end",)),
        (
            (H, "head-with-chunks", C),
            (C, "body-end", DONE),
            (DONE, "next-request", H),
            (H, "head-without-body", DONE),
        ),
    ),
    Case(
        "bad chunk framing",
        (POST_CHUNKED, b"zz\r\nabc\r\n", b"more"),
        (("head", "POST", "/build"), ("error", 400, "http")),
        ((H, "head-with-chunks", C), (C, "bad-chunk", B)),
        said="bad chunk size",
        ends_in=B,
    ),
    Case(
        "both Content-Length and Transfer-Encoding",
        (req("POST /x HTTP/1.1", "Content-Length: 3", "Transfer-Encoding: chunked"),),
        (("error", 400, "http"),),
        ((H, "bad-head", B),),
        said="Content-Length",
    ),
    Case(
        "a malformed head after a partial read",
        (b"GET /x HTTP/1.1\r\nHost : d", b"ocker\r\n\r\n"),
        (("error", 400, "http"),),
        ((H, "bad-head", B),),
        said="malformed request",
    ),
    Case(
        "a head longer than the limit",
        (b"GET /x HTTP/1.1\r\nX-Pad: " + b"a" * MAX_HEAD, b"a"),
        (("error", 400, "limit"),),
        ((H, "bad-head", B),),
        said=f"larger than {MAX_HEAD} bytes",
    ),
    Case(
        "Expect: 100-continue is read from the head (the server answers it)",
        (req("POST /x HTTP/1.1", "Expect: 100-continue", "Content-Length: 3"), b"abc"),
        (("head", "POST", "/x"), ("data", b"abc"), ("end",)),
        ((H, "head-with-length", L), (L, "body-end", DONE)),
        extra={"expect_continue": True},
    ),
    Case(
        "exec start with Upgrade: tcp: once the daemon switches, what the client sent next is raw",
        (EXEC_START + b"ls\n", SWITCH, b"exit\n"),
        (
            ("head", "POST", "/exec/e1/start"),
            ("data", b"{}"),
            ("end",),
            ("held", b"ls\n"),
            ("data", b"exit\n"),
        ),
        ((H, "head-with-length", L), (L, "body-end", DONE), (DONE, "switch", T)),
        ends_in=T,
    ),
    Case(
        "a switch while a Content-Length body is still streaming",
        (POST_3 + b"a", SWITCH, b"raw"),
        (("head", "POST", "/x"), ("data", b"a"), ("held", b""), ("data", b"raw")),
        ((H, "head-with-length", L), (L, "switch", T)),
    ),
    Case(
        "a switch while a chunked body is still streaming",
        (POST_CHUNKED + b"1\r\na\r\n", SWITCH),
        (("head", "POST", "/build"), ("data", b"a"), ("held", b"")),
        ((H, "head-with-chunks", C), (C, "switch", T)),
    ),
]

RESPONSE_CASES = [
    Case(
        "a whole response in one read is relayed as read",
        (sent(), OK_2 + b"OK"),
        (("head", 200), ("data", OK_2 + b"OK"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-with-length", L), (L, "body-end", IDLE)),
        as_views=True,
    ),
    Case(
        "a bodiless response in one read",
        (sent("DELETE"), b"HTTP/1.1 204 No Content\r\n\r\n"),
        (("head", 204), ("data", b"HTTP/1.1 204 No Content\r\n\r\n"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-without-body", IDLE)),
    ),
    Case(
        "the answer to HEAD has no body whatever its Content-Length",
        (sent("HEAD"), b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n", b"\r\n"),
        (("head", 200), ("data", b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-without-body", IDLE)),
    ),
    Case(
        "304 has no body",
        (sent(), b"HTTP/1.1 304 Not Modified\r\nContent", b"-Length: 5\r\n\r\n"),
        (("head", 304), ("data", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-without-body", IDLE)),
    ),
    Case(
        "a head and part of its body, then the rest: the head goes out with the first part",
        (sent(), OK_2[:10], OK_2[10:] + b"O", b"K"),
        (("head", 200), ("data", OK_2 + b"O"), ("data", b"K"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-with-length", L), (L, "body-end", IDLE)),
        as_views=True,
    ),
    Case(
        "a head alone, its body later",
        (sent(), OK_2, b"OK"),
        (("head", 200), ("data", OK_2), ("data", b"OK"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-with-length", L), (L, "body-end", IDLE)),
    ),
    Case(
        "a read bigger than a whole response is tried as",
        (sent(), b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + b"x" * 70000),
        (
            ("head", 200),
            ("data", b"HTTP/1.1 200 OK\r\nContent-Length: 70000\r\n\r\n" + b"x" * 70000),
            ("end",),
        ),
        ((IDLE, "request-sent", H), (H, "head-with-length", L), (L, "body-end", IDLE)),
        as_views=True,
    ),
    Case(
        "1xx interim heads are relayed and the final head follows",
        (sent("POST"), b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 102 Processing\r\n\r\n" + OK_2 + b"OK"),
        (
            ("head", 100),
            ("data", b"HTTP/1.1 100 Continue\r\n\r\n"),
            ("head", 102),
            ("data", b"HTTP/1.1 102 Processing\r\n\r\n"),
            ("head", 200),
            ("data", OK_2 + b"OK"),
            ("end",),
        ),
        (
            (IDLE, "request-sent", H),
            (H, "interim-head", H),
            (H, "interim-head", H),
            (H, "head-with-length", L),
            (L, "body-end", IDLE),
        ),
    ),
    Case(
        "a chunked response is relayed as framed, to its last chunk",
        (sent(), CHUNKED_OK + b"3\r\nabc\r\n", b"0\r\n\r\n"),
        (("head", 200), ("data", CHUNKED_OK + b"3\r\nabc\r\n"), ("data", b"0\r\n\r\n"), ("end",)),
        ((IDLE, "request-sent", H), (H, "head-with-chunks", C), (C, "body-end", IDLE)),
        as_views=True,
    ),
    Case(
        "a bad chunked response: the whole chunks before the bad line are relayed, nothing after",
        (sent(), CHUNKED_OK, b"3\r\nabc\r\nzz\r\n", b"more"),
        (("head", 200), ("data", CHUNKED_OK), ("data", b"3\r\nabc\r\n"), ("error", 0, "upstream")),
        ((IDLE, "request-sent", H), (H, "head-with-chunks", C), (C, "bad-chunk", B)),
        said="bad chunked response from the daemon",
        ends_in=B,
    ),
    Case(
        "bytes after a chunked response's end",
        (sent(), CHUNKED_OK + b"0\r\n\r\nextra"),
        (("head", 200), ("data", CHUNKED_OK + b"0\r\n\r\n"), ("error", 0, "upstream")),
        ((IDLE, "request-sent", H), (H, "head-with-chunks", C), (C, "body-end", IDLE), (IDLE, "surplus", B)),
        said="after a complete response",
    ),
    Case(
        "a daemon body longer than its Content-Length: the surplus is not relayed",
        (sent(), OK_2, b"OKextra"),
        (("head", 200), ("data", OK_2), ("data", b"OK"), ("error", 0, "upstream")),
        ((IDLE, "request-sent", H), (H, "head-with-length", L), (L, "body-end", IDLE), (IDLE, "surplus", B)),
        said="after a complete response",
        as_views=True,
    ),
    Case(
        "bytes after a bodiless response",
        (sent(), b"HTTP/1.1 204 No Content\r\n\r\nextra", b"ignored"),
        (("head", 204), ("data", b"HTTP/1.1 204 No Content\r\n\r\n"), ("error", 0, "upstream")),
        ((IDLE, "request-sent", H), (H, "head-without-body", IDLE), (IDLE, "surplus", B)),
        said="after a complete response",
    ),
    Case(
        "bytes with no request outstanding",
        (b"HTTP/1.1 200 OK\r\n\r\n",),
        (("error", 0, "upstream"),),
        ((IDLE, "surplus", B),),
        said="no request outstanding",
    ),
    Case(
        "101 switches to a tunnel; the rest of the read comes after the switch, as tunnel data",
        (sent("POST"), b"HTTP/1.1 101 UPGRADED\r\nUpgrade: tcp\r\n\r\nhello", b"more"),
        (
            ("head", 101),
            ("data", b"HTTP/1.1 101 UPGRADED\r\nUpgrade: tcp\r\n\r\n"),
            ("tunnel",),
            ("data", b"hello"),
            ("data", b"more"),
        ),
        ((IDLE, "request-sent", H), (H, "switching-head", T)),
        ends_in=T,
    ),
    Case(
        "a body read until the daemon closes is a hijacked stream: a tunnel",
        (sent("POST"), b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n"),
        (
            ("head", 200),
            ("data", b"HTTP/1.1 200 OK\r\nContent-Type: application/vnd.docker.raw-stream\r\n\r\n"),
            ("tunnel",),
        ),
        ((IDLE, "request-sent", H), (H, "head-until-close", T)),
    ),
    Case(
        "a garbled status line",
        (sent(), b"HTTP/2 200 OK\r\n\r\n"),
        (("error", 502, "upstream"),),
        ((IDLE, "request-sent", H), (H, "bad-head", B)),
        said="malformed response",
    ),
    Case(
        "a response head longer than the limit",
        (sent(), b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * MAX_HEAD),
        (("error", 502, "upstream"),),
        ((IDLE, "request-sent", H), (H, "bad-head", B)),
        said="too large",
    ),
    Case(
        "an idle keep-alive connection the daemon closes is harmless",
        (eof(),),
        (("eof", None),),
        ((IDLE, "eof", IDLE),),
    ),
    Case(
        "the daemon closes before answering: the client can still get a 502",
        (sent(), b"HTTP/1.1 20", eof()),
        (("eof", ("error", 502, "upstream")),),
        ((IDLE, "request-sent", H), (H, "eof", B)),
    ),
    Case(
        "the daemon closes after an interim head: too late for a 502",
        (sent(), b"HTTP/1.1 100 Continue\r\n\r\n", eof("dropped")),
        (("head", 100), ("data", b"HTTP/1.1 100 Continue\r\n\r\n"), ("eof", ("error", 0, "upstream"))),
        ((IDLE, "request-sent", H), (H, "interim-head", H), (H, "eof", B)),
    ),
    Case(
        "the daemon closes in the middle of a Content-Length body",
        (sent(), OK_2 + b"O", eof()),
        (("head", 200), ("data", OK_2 + b"O"), ("eof", ("error", 0, "upstream"))),
        ((IDLE, "request-sent", H), (H, "head-with-length", L), (L, "eof", B)),
    ),
    Case(
        "the daemon closes in the middle of a chunked body",
        (sent(), CHUNKED_OK + b"3\r\nab", eof()),
        (("head", 200), ("data", CHUNKED_OK + b"3\r\nab"), ("eof", ("error", 0, "upstream"))),
        ((IDLE, "request-sent", H), (H, "head-with-chunks", C), (C, "eof", B)),
    ),
]


@pytest.mark.parametrize("case", REQUEST_CASES, ids=lambda case: case.name)
def test_request_framing(case: Case) -> None:
    framer, events, taken = run_request_case(case)
    assert rendered(events) == case.events
    assert tuple(taken) == case.taken
    assert case.said in messages(events)
    if case.ends_in is not None:
        assert framer.state == case.ends_in
        assert list(framer.feed(b"anything")) == ([] if case.ends_in == B else [b"anything"])
    for name, value in case.extra.items():
        assert getattr(next(e for e in events if isinstance(e, RequestHead)), name) == value


@pytest.mark.parametrize("case", RESPONSE_CASES, ids=lambda case: case.name)
def test_response_framing(case: Case) -> None:
    framer, events, taken = run_response_case(case)
    assert rendered(events) == case.events
    assert tuple(taken) == case.taken
    said = case.said or ""
    assert said in messages(events) + " ".join(str(e) for e in events if isinstance(e, tuple))
    if case.ends_in is not None:
        assert framer.state == case.ends_in
        assert list(framer.feed(b"x")) == ([] if case.ends_in == B else [b"x"])


def test_every_transition_in_the_tables_is_taken_by_some_case() -> None:
    taken_requests = {t for case in REQUEST_CASES for t in run_request_case(case)[2]}
    taken_responses = {t for case in RESPONSE_CASES for t in run_response_case(case)[2]}
    assert taken_requests == set(table_rows(REQUEST_TRANSITIONS))
    assert taken_responses == set(table_rows(RESPONSE_TRANSITIONS))


@pytest.mark.parametrize(
    ("title", "table"),
    [
        ("Request framer (what the client sends)::", REQUEST_TRANSITIONS),
        ("Response framer (what the daemon sends)::", RESPONSE_TRANSITIONS),
    ],
)
def test_the_docstring_tables_are_the_tables_the_code_uses(
    title: str, table: dict[str, dict[str, str]]
) -> None:
    assert docstring_rows(framing, title) == list(table_rows(table))


def test_a_transition_the_table_lacks_is_a_bug_not_a_state() -> None:
    with pytest.raises(KeyError, match="next-request"):
        RequestFramer().next_request()
    framer = ResponseFramer()
    framer.feed(b"junk")
    with pytest.raises(KeyError, match="eof"):
        framer.eof()


def test_pipelined_bytes_are_held_until_the_exchange_ends() -> None:
    framer = RequestFramer()
    assert rendered(framer.feed(GET_PING + GET_PING[:7])) == (("head", "GET", "/_ping"), ("end",))
    assert len(framer.held) == 7
    assert not framer.feed(GET_PING[7:])  # still the first exchange's turn
    assert len(framer.held) == len(GET_PING)
    assert rendered(framer.next_request()) == (("head", "GET", "/_ping"), ("end",))
    assert len(framer.held) == 0


def test_a_request_body_view_points_into_the_read_it_came_in() -> None:
    framer = RequestFramer()
    framer.feed(POST_3)
    read = bytearray(b"abcGET")
    events = framer.feed(memoryview(read))
    body = events[0]
    assert isinstance(body, memoryview) and body.obj is read  # no copy: the server uses it at once
    assert len(framer.held) == 3  # what followed was copied, since the read buffer is reused


def test_a_response_under_way_cannot_be_answered_with_an_error() -> None:
    framer = ResponseFramer()
    assert not framer.under_way
    framer.request_sent("GET")
    framer.feed(OK_2)
    assert framer.under_way
    framer.feed(b"OK")
    assert not framer.under_way  # finished: an error for the next request may be answered


def test_whole_response_limit_is_the_read_size_tried_at_once() -> None:
    assert 16 * 1024 <= WHOLE_RESPONSE_MAX <= 256 * 1024


def test_the_marker_events_read_well_in_test_output() -> None:
    assert (repr(END), repr(TUNNEL)) == ("END", "TUNNEL")
