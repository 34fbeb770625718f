"""The /grpc relay, driven through the in-memory backend of `grpc_kit`: calls relayed both ways,
checked calls judged before the daemon sees them, refusals answered by the gate, flow control."""

from __future__ import annotations

import gzip
import urllib.parse

from grpc_kit import Wire, request_headers, solve_request, unframe

from rediacc_core.gate import buildkit
from rediacc_core.gate.buildkit import Verdict
from rediacc_core.gate.buildkit.llb import BuildPolicy
from rediacc_core.gate.buildkit.relay import MAX_MESSAGE, WINDOW, grpc_message
from rediacc_core.gate.wire.protowire import Message, length_field

SOLVE = buildkit.CONTROL + "Solve"
LIST_WORKERS = buildkit.CONTROL + "ListWorkers"


def judge(path: str, message: bytes) -> Verdict:
    return buildkit.check(path, message, BuildPolicy(hard_limits={}))


def status_of(headers: list[tuple[bytes, bytes]]) -> tuple[str, str]:
    found = dict(headers)
    return found.get(b"grpc-status", b"").decode(), urllib.parse.unquote(
        found.get(b"grpc-message", b"").decode()
    )


def test_a_forwarded_call_is_relayed_both_ways() -> None:
    wire = Wire(judge)
    stream = wire.call(LIST_WORKERS, b"\x0a\x03abc")
    at_daemon = wire.at_daemon[1]
    assert dict(at_daemon.headers)[b":path"] == LIST_WORKERS.encode()
    assert unframe(bytes(at_daemon.data)) == [b"\x0a\x03abc"] and at_daemon.ended
    wire.answer(1, b"reply")
    at_client = wire.at_client[stream]
    assert unframe(bytes(at_client.data)) == [b"reply"] and status_of(at_client.trailers) == ("0", "")
    assert wire.relay.calls == {}  # the call is over on both sides


def test_a_checked_call_that_passes_reaches_the_daemon_with_the_built_in_frontend_pinned() -> None:
    wire = Wire(judge)
    wire.call(SOLVE, solve_request("dockerfile.v0", {"filename": "Dockerfile"}))
    (sent,) = unframe(bytes(wire.at_daemon[1].data))
    assert Message(sent).string_map(7) == {"filename": "Dockerfile", "cmdline": ""}
    assert wire.reports == [(SOLVE, 0, buildkit.PIN_NOTE, ())]


def test_a_refused_call_is_answered_by_the_gate_and_never_reaches_the_daemon() -> None:
    wire = Wire(judge)
    stream = wire.call(SOLVE, solve_request(f9=b"network.host"))
    answer = wire.at_client[stream]
    status, message = status_of(answer.headers)  # trailers-only: one HEADERS frame that ends the call
    assert status == "7" and answer.ended
    assert "--allow network.host" in message and "use instead:" in message
    assert wire.at_daemon == {}
    assert wire.reports[0][1:] == (7, message, ("build-option",))


def test_a_method_the_gate_does_not_know_is_refused() -> None:
    wire = Wire(judge)
    stream = wire.call("/moby.buildkit.v1.Control/SomethingNew", b"")
    assert status_of(wire.at_client[stream].headers)[0] == "7"
    assert wire.at_daemon == {}


def test_an_error_the_daemon_answers_with_headers_alone_stays_a_trailers_only_answer() -> None:
    wire = Wire(judge)
    stream = wire.call(LIST_WORKERS, b"")
    wire.daemon.send_headers(
        1,
        [(b":status", b"200"), (b"content-type", b"application/grpc"), (b"grpc-status", b"13")],
        end_stream=True,
    )
    wire.pump()
    answer = wire.at_client[stream]
    assert status_of(answer.headers)[0] == "13" and answer.ended and answer.trailers == []


def test_a_later_message_of_a_stream_can_still_be_refused_and_the_daemon_sees_the_call_cancelled() -> None:
    wire = Wire(judge)
    stream = wire.call(buildkit.BRIDGE + "ExecProcess", length_field(1, "p1"), end=False)
    assert wire.at_daemon[1].data  # a message without an Init passes
    wire.daemon.send_headers(1, [(b":status", b"200"), (b"content-type", b"application/grpc")])
    wire.pump()
    insecure = length_field(2, length_field(1, "c1") + b"\x28\x01")  # Init{ContainerID, Security: INSECURE}
    wire.client.send_data(stream, b"\x00" + len(insecure).to_bytes(4, "big") + insecure)
    wire.pump()
    assert status_of(wire.at_client[stream].trailers)[0] == "7"
    assert wire.at_daemon[1].reset is not None
    assert len(unframe(bytes(wire.at_daemon[1].data))) == 1


def test_flow_control_holds_at_most_a_window_while_the_daemon_does_not_read() -> None:
    wire = Wire(judge)
    wire.daemon_acks = False
    big = b"x" * (3 * WINDOW)
    stream = wire.client.get_next_available_stream_id()
    wire.client.send_headers(stream, request_headers(LIST_WORKERS))
    sent = 0
    for _ in range(50):  # the client writes as its window lets it
        window = wire.client.local_flow_control_window(stream)
        room = min(window, wire.client.max_outbound_frame_size, len(big) - sent)
        if room <= 0:
            break
        wire.client.send_data(stream, big[sent : sent + room])
        sent += room
        wire.pump()
    assert sent <= 3 * WINDOW
    assert len(wire.at_daemon[1].data) <= WINDOW
    queued = sum(len(p) for kind, p, _ in wire.relay.calls[stream].to_upstream if kind == "data")
    assert queued + len(wire.at_daemon[1].data) <= WINDOW + 65535 * 2


def test_an_oversized_checked_message_is_refused_without_being_held() -> None:
    wire = Wire(judge)
    stream = wire.client.get_next_available_stream_id()
    wire.client.send_headers(stream, request_headers(SOLVE))
    wire.client.send_data(stream, b"\x00" + (MAX_MESSAGE + 1).to_bytes(4, "big") + b"x" * 100)
    wire.pump()
    assert status_of(wire.at_client[stream].headers)[0] == "8"
    assert wire.relay.held == 0 and wire.at_daemon == {}


def test_a_compressed_checked_message_is_refused_and_never_reaches_the_daemon() -> None:
    """The gate judges a message's plain bytes; a compressed one (grpc-encoding gzip) would reach the
    daemon, which inflates it, unjudged. So the compressed flag alone is a refusal, even for a Solve
    that would pass plain."""
    for solve in (solve_request(f9=b"network.host"), solve_request("dockerfile.v0")):
        wire = Wire(judge)
        stream = wire.client.get_next_available_stream_id()
        wire.client.send_headers(stream, [*request_headers(SOLVE), (b"grpc-encoding", b"gzip")])
        packed = gzip.compress(solve)
        wire.client.send_data(stream, b"\x01" + len(packed).to_bytes(4, "big") + packed, end_stream=True)
        wire.pump()
        status, message = status_of(wire.at_client[stream].headers)
        assert status == "3" and "compressed request messages are refused (send them plain)" in message
        assert wire.at_daemon == {}
        assert wire.reports == [(SOLVE, 3, message, ("bad-request",))]


def test_grpc_messages_are_percent_encoded() -> None:
    assert grpc_message("a%b\nc é") == b"a%25b%0Ac %C3%A9"
