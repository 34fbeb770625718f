"""A gate connection's exchange, without sockets: each case is a script of what the client, the
daemon, the decider and the clock did, and lists the actions the exchange asked for and the
transitions it took on the way.

The performer here is an in-memory seam (as httpcore's mock backend): it records each action and
answers `route` from a table. The cases together take every transition in the exchange's two
tables (checked below), and the module docstring's tables are checked against the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from transitions_kit import Table, Transition, docstring_rows, recording, table_rows

from rediacc_core.gate.decide.decision import Answer, Decision, Forward, Refuse
from rediacc_core.gate.http import exchange
from rediacc_core.gate.http.exchange import PHASES, UPSTREAM, Exchange
from rediacc_core.gate.http.messages import RequestHead

Action = tuple[Any, ...]


REFUSED = Refuse(403, "no")
ROUTES: dict[str, tuple[Decision | None, bool]] = {
    "/refused": (REFUSED, False),
    "/v1.45/containers/create": (None, True),
    "/v1.45/info": (None, True),
}


class Recorder:
    """The performer: what the exchange asked for, in order."""

    def __init__(self) -> None:
        self.held = 0
        self.actions: list[Action] = []

    def route(self, method: str, target: str) -> tuple[Decision | None, bool]:
        if target == "/broken-route":
            raise RuntimeError("the decider broke")
        return ROUTES.get(target, (None, False))

    def write(self, data: bytes | memoryview) -> None:
        self.actions.append(("write", first_line(data)))

    def send(self, data: bytes | memoryview) -> None:
        self.actions.append(("send", first_line(data)))

    def connect(self) -> None:
        self.actions.append(("connect",))

    def decide(self, req: RequestHead, body: bytes) -> None:
        self.actions.append(("decide", req.target, body))

    def judged(self, req: RequestHead, decision: Decision) -> None:
        self.actions.append(("judged", decision.status if not decision.forward else "forward"))

    def pause(self, reason: str) -> None:
        self.actions.append(("pause", reason))

    def resume(self, reason: str) -> None:
        self.actions.append(("resume", reason))

    def hand_to_relay(self, rest: bytes, client_ended: bool) -> None:
        self.actions.append(("relay", rest, client_ended))

    def relay_upstream(self, data: bytes) -> None:
        self.actions.append(("relay-upstream", data))

    def end_upstream(self) -> None:
        self.actions.append(("end-upstream",))

    def end_client(self) -> None:
        self.actions.append(("end-client",))

    def drop_upstream(self) -> None:
        self.actions.append(("drop-upstream",))

    def account(self) -> None:
        self.actions.append(("account",))

    def refused(self, status: int, message: str, rule: str) -> None:
        self.actions.append(("refused", status, rule))

    def log(self, line: str) -> None:
        self.actions.append(("log", line))

    def close(self, first: bool) -> None:
        self.actions.append(("close", first))


def first_line(data: bytes | memoryview) -> str:
    return bytes(data).split(b"\r\n", 1)[0].decode("latin-1")


# --- the script's steps ------------------------------------------------------------------------
def client(data: bytes) -> Action:
    return ("client", data)


def daemon(data: bytes) -> Action:
    return ("daemon", data)


CONNECTED: Action = ("connected",)
CLIENT_EOF: Action = ("client-eof",)
DAEMON_EOF: Action = ("daemon-eof",)
DAEMON_LOST: Action = ("daemon-lost",)
CLIENT_LOST: Action = ("client-lost",)
EXPIRE: Action = ("expire",)


def decided(decision: Decision) -> Action:
    return ("decided", decision)


GET_PING = b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n"
OK_PING = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"
CREATE = b"POST /v1.45/containers/create HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\n"
CREATED = b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n{}"
ATTACH = (
    b"POST /v1.45/containers/c1/attach?stream=1 HTTP/1.1\r\nHost: d\r\n"
    b"Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
)
SWITCHED = b"HTTP/1.1 101 UPGRADED\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n"
GRPC = b"POST /grpc HTTP/1.1\r\nHost: d\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
SWITCHED_H2 = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"


@dataclass
class Case:
    name: str
    script: list[Action]
    actions: list[Action]
    taken: list[Transition] = field(default_factory=list)
    phase: str | None = None  # the phase it ends in, when it matters


CASES = [
    Case(
        "a keep-alive GET: the first opens the daemon's connection, the second goes straight out",
        [client(GET_PING), CONNECTED, daemon(OK_PING), client(GET_PING), daemon(OK_PING)],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "GET /_ping HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 200 OK"),
            ("resume", "pipeline"),
            ("send", "GET /_ping HTTP/1.1"),
            ("write", "HTTP/1.1 200 OK"),
            ("resume", "pipeline"),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "exchange-end", "idle"),
            ("idle", "passed-head", "forwarded"),
            ("forwarded", "exchange-end", "idle"),
        ],
        "idle",
    ),
    Case(
        "two pipelined requests in one read: the second is framed once the first is answered",
        [client(GET_PING + GET_PING), CONNECTED, daemon(OK_PING), daemon(OK_PING)],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "GET /_ping HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 200 OK"),
            ("resume", "pipeline"),
            ("send", "GET /_ping HTTP/1.1"),
            ("write", "HTTP/1.1 200 OK"),
            ("resume", "pipeline"),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "exchange-end", "idle"),
            ("idle", "passed-head", "forwarded"),
            ("forwarded", "exchange-end", "idle"),
        ],
        "idle",
    ),
    Case(
        "a request refused from its head: its body is read and dropped, then the refusal answers it",
        [client(b"POST /refused HTTP/1.1\r\nContent-Length: 3\r\n\r\n"), client(b"abc")],
        [
            ("judged", 403),
            ("log", "refused 403 POST /refused: no"),
            ("write", "HTTP/1.1 403 Forbidden"),
            ("resume", "decide"),
            ("resume", "pipeline"),
        ],
        [
            ("idle", "refused-head", "dropping"),
            ("dropping", "request-end", "deciding"),
            ("deciding", "answered", "idle"),
        ],
        "idle",
    ),
    Case(
        "a refusal on a connection the client closes: answered, then closed",
        [client(b"GET /refused HTTP/1.1\r\nConnection: close\r\n\r\n")],
        [
            ("judged", 403),
            ("log", "refused 403 GET /refused: no"),
            ("write", "HTTP/1.1 403 Forbidden"),
            ("close", True),
        ],
        [
            ("idle", "refused-head", "dropping"),
            ("dropping", "request-end", "deciding"),
            ("deciding", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "the client goes away in the middle of a refused body: closed",
        [client(b"POST /refused HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc"), CLIENT_EOF],
        [("close", True)],
        [("idle", "refused-head", "dropping"), ("dropping", "close", "closed")],
        "closed",
    ),
    Case(
        "an inspected body: 100-continue, read whole, decided, forwarded with the canonical body",
        [
            client(CREATE + b"Expect: 100-continue\r\nContent-Length: 2\r\n\r\n"),
            client(b"{}"),
            decided(Forward(body=b'{"Image":"x"}')),
            CONNECTED,
            daemon(CREATED),
        ],
        [
            ("write", "HTTP/1.1 100 Continue"),
            ("account",),
            ("account",),
            ("pause", "decide"),
            ("decide", "/v1.45/containers/create", b"{}"),
            ("judged", "forward"),
            ("pause", "connect"),
            ("connect",),
            ("resume", "decide"),
            ("send", "POST /v1.45/containers/create HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 201 Created"),
            ("resume", "pipeline"),
        ],
        [
            ("idle", "inspected-head", "reading"),
            ("reading", "request-end", "deciding"),
            ("deciding", "admitted", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "exchange-end", "idle"),
        ],
        "idle",
    ),
    Case(
        "an inspected request the gate answers itself (a view): answered without the daemon",
        [client(b"GET /v1.45/info HTTP/1.1\r\n\r\n"), decided(Answer(b"{}"))],
        [
            ("account",),
            ("pause", "decide"),
            ("decide", "/v1.45/info", b""),
            ("judged", 200),
            ("write", "HTTP/1.1 200 OK"),
            ("resume", "decide"),
            ("resume", "pipeline"),
        ],
        [
            ("idle", "inspected-head", "reading"),
            ("reading", "request-end", "deciding"),
            ("deciding", "answered", "idle"),
        ],
        "idle",
    ),
    Case(
        "the decider raises: 500 and closed",
        [client(CREATE + b"Content-Length: 2\r\n\r\n{}"), ("undecided", RuntimeError("boom"))],
        [
            ("account",),
            ("pause", "decide"),
            ("decide", "/v1.45/containers/create", b"{}"),
            ("refused", 500, "gate"),
            ("write", "HTTP/1.1 500 Internal Server Error"),
            ("close", True),
        ],
        [
            ("idle", "inspected-head", "reading"),
            ("reading", "request-end", "deciding"),
            ("deciding", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "route raises on a head: 500 and closed",
        [client(b"GET /broken-route HTTP/1.1\r\n\r\n")],
        [("refused", 500, "gate"), ("write", "HTTP/1.1 500 Internal Server Error"), ("close", True)],
        [("idle", "close", "closed")],
        "closed",
    ),
    Case(
        "an inspected body that does not arrive in time: 408 and closed",
        [client(CREATE + b"Content-Length: 9\r\n\r\n{"), EXPIRE],
        [("account",), ("refused", 408, "limit"), ("write", "HTTP/1.1 408 Request Timeout"), ("close", True)],
        [("idle", "inspected-head", "reading"), ("reading", "close", "closed")],
        "closed",
    ),
    Case(
        "a head that does not arrive in time: 408 and closed",
        [client(b"GET /_ping HTTP/1.1\r\n"), EXPIRE],
        [("account",), ("refused", 408, "limit"), ("write", "HTTP/1.1 408 Request Timeout"), ("close", True)],
        [("idle", "close", "closed")],
        "closed",
    ),
    Case(
        "a head that cannot be framed: 400 and closed",
        [client(b"GET /_ping HTTP/1.1\r\nContent-Length: x\r\n\r\n")],
        [("refused", 400, "http"), ("write", "HTTP/1.1 400 Bad Request"), ("close", True)],
        [("idle", "close", "closed")],
        "closed",
    ),
    Case(
        "the daemon answers before the body is all sent: the body's end finishes the exchange",
        [
            client(b"PUT /v1.45/containers/c1/archive HTTP/1.1\r\nContent-Length: 4\r\n\r\nab"),
            CONNECTED,
            daemon(OK_PING),
            client(b"cd"),
        ],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "PUT /v1.45/containers/c1/archive HTTP/1.1"),
            ("send", "ab"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 200 OK"),
            ("send", "cd"),
            ("resume", "pipeline"),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "exchange-end", "idle"),
        ],
        "idle",
    ),
    Case(
        "a response that closes the connection: relayed, then closed",
        [
            client(GET_PING),
            CONNECTED,
            daemon(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"),
        ],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "GET /_ping HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 200 OK"),
            ("close", True),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "the daemon lets an idle connection go: the next request opens a new one",
        [client(GET_PING), CONNECTED, daemon(OK_PING), DAEMON_EOF, client(GET_PING), CONNECTED],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "GET /_ping HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 200 OK"),
            ("resume", "pipeline"),
            ("drop-upstream",),
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "GET /_ping HTTP/1.1"),
            ("resume", "connect"),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "exchange-end", "idle"),
            ("open", "idle-eof", "none"),
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
        ],
        "forwarded",
    ),
    Case(
        "the daemon's connection drops before it answers: 502 and closed",
        [client(GET_PING), CONNECTED, DAEMON_LOST],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "GET /_ping HTTP/1.1"),
            ("resume", "connect"),
            ("refused", 502, "upstream"),
            ("write", "HTTP/1.1 502 Bad Gateway"),
            ("close", True),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("open", "lost", "none"),
            ("forwarded", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "the daemon cannot be reached: 502 naming the command that starts it",
        [client(GET_PING), ("connect-failed", "start it with: rdc repo up r")],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("refused", 502, "upstream"),
            ("write", "HTTP/1.1 502 Bad Gateway"),
            ("close", True),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connect-failed", "none"),
            ("forwarded", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "the client leaves while the daemon's connection is made: that connection fails quietly",
        [client(GET_PING), CLIENT_LOST, ("connect-failed", "no daemon")],
        [("pause", "connect"), ("connect",), ("account",), ("refused", 502, "upstream"), ("close", False)],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("forwarded", "close", "closed"),
            ("connecting", "connect-failed", "none"),
            ("closed", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "a 101 turns the connection into a tunnel; each half-close passes to the other side",
        [
            client(ATTACH),
            CONNECTED,
            daemon(SWITCHED + b"out"),
            client(b"in"),
            CLIENT_EOF,
            daemon(b"more"),
            DAEMON_EOF,
        ],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "POST /v1.45/containers/c1/attach?stream=1 HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 101 UPGRADED"),
            ("resume", "pipeline"),
            ("write", "out"),
            ("send", "in"),
            ("end-upstream",),
            ("write", "more"),
            ("end-client",),
            ("close", True),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "switch", "tunnel"),
            ("tunnel", "close", "closed"),
        ],
        "closed",
    ),
    Case(
        "BuildKit's /grpc after its 101 goes to the gRPC relay, with the bytes read past the head",
        [client(GRPC), CONNECTED, daemon(SWITCHED_H2 + b"h2"), DAEMON_LOST],
        [
            ("pause", "connect"),
            ("connect",),
            ("account",),
            ("send", "POST /grpc HTTP/1.1"),
            ("resume", "connect"),
            ("write", "HTTP/1.1 101 Switching Protocols"),
            ("relay", b"", False),
            ("resume", "pipeline"),
            ("relay-upstream", b"h2"),
            ("close", True),
        ],
        [
            ("idle", "passed-head", "forwarded"),
            ("none", "connect", "connecting"),
            ("connecting", "connected", "open"),
            ("forwarded", "grpc-switch", "relay"),
            ("open", "lost", "none"),
            ("relay", "close", "closed"),
        ],
        "closed",
    ),
]


def run(case: Case) -> tuple[Exchange, Recorder, list[Transition]]:
    io = Recorder()
    ex = Exchange(io, head_timeout=30, body_timeout=60, clock=lambda: 100.0)
    with recording(exchange, "PHASES", "UPSTREAM") as taken:
        for step in case.script:
            kind = step[0]
            if kind == "client":
                ex.client_data(step[1])
            elif kind == "daemon":
                ex.upstream_data(step[1])
            elif kind == "connected":
                ex.connected()
            elif kind == "connect-failed":
                ex.connect_failed(step[1])
            elif kind == "client-eof":
                ex.client_ended()
            elif kind == "daemon-eof":
                ex.upstream_ended()
            elif kind == "daemon-lost":
                ex.upstream_lost()
            elif kind == "client-lost":
                ex.lost()
            elif kind == "expire":
                assert ex.deadline, "no deadline was set"
                ex.expired()
            elif kind == "decided":
                assert ex.req is not None
                ex.decided(ex.req, b"", step[1])
            elif kind == "undecided":
                ex.undecided(step[1])
    return ex, io, taken


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_case(case: Case) -> None:
    ex, io, taken = run(case)
    assert io.actions == case.actions
    assert taken == case.taken
    if case.phase is not None:
        assert ex.phase == case.phase


def test_every_transition_in_the_tables_is_taken_by_some_case() -> None:
    taken = {t for case in CASES for t in run(case)[2]}
    assert taken == set(table_rows(PHASES)) | set(table_rows(UPSTREAM))


def test_a_deadline_is_set_from_the_clock_when_a_head_is_unfinished_and_cleared_by_its_end() -> None:
    ex = Exchange(Recorder(), head_timeout=30, body_timeout=60, clock=lambda: 100.0)
    ex.client_data(b"GET /_ping HTTP/1.1\r\n")
    assert ex.deadline == 130.0
    ex.client_data(b"\r\n")
    assert ex.deadline == 0.0


def test_the_exchange_counts_what_it_holds() -> None:
    ex = Exchange(Recorder(), head_timeout=30, body_timeout=60)
    ex.client_data(CREATE + b"Content-Length: 9\r\n\r\n{}")
    assert ex.holding() == 2  # the inspected body so far
    ex.client_data(b"1234567GET /_ping HTTP/1.1\r\n")
    assert ex.phase == "deciding"
    assert ex.holding() == len(b"GET /_ping HTTP/1.1\r\n")  # the next request's head, held back


@pytest.mark.parametrize(
    ("title", "table"),
    [("Phases of the request in progress::", PHASES), ("The daemon's connection::", UPSTREAM)],
)
def test_the_docstring_tables_are_the_tables_the_code_uses(title: str, table: Table) -> None:
    assert docstring_rows(exchange, title) == list(table_rows(table))
