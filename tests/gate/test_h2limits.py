"""The frame meter of `/grpc` (`h2limits.FrameMeter`) on a clock of the test's own: its budget, its
refill, and frames read the same however the bytes are cut."""

from __future__ import annotations

import pytest
from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame, PingFrame, RstStreamFrame

from rediacc_core.gate.buildkit.h2limits import (
    COSTLY,
    CREDIT_BYTES,
    FRAME_BURST,
    FRAME_RATE,
    MAX_HEADER_BLOCK,
    PREFACE,
    Abuse,
    FrameMeter,
)

PING = PingFrame(0).serialize()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_holds_a_burst_then_refills_at_its_rate() -> None:
    clock = Clock()
    meter = FrameMeter(clock)
    meter.feed(PREFACE + PING * int(FRAME_BURST))
    with pytest.raises(Abuse, match="control frames"):
        meter.feed(PING)
    clock.now += 1.0
    meter = FrameMeter(clock)
    meter.feed(PREFACE)
    for _ in range(10):  # ten seconds at the sustained rate: never past the bound
        meter.feed(PING * int(FRAME_RATE))
        clock.now += 1.0


def test_what_the_gate_sends_the_client_pays_for_its_acknowledgements() -> None:
    meter = FrameMeter(Clock())
    meter.feed(PREFACE + PING * int(FRAME_BURST))
    assert meter.credited(b"x" * CREDIT_BYTES * 100) == b"x" * CREDIT_BYTES * 100
    meter.feed(PING * 100)
    with pytest.raises(Abuse):
        meter.feed(PING)
    meter = FrameMeter(Clock())  # (an abused meter's connection is gone)
    meter.credited(b"x" * CREDIT_BYTES * 10 * int(FRAME_BURST))  # never more than a burst banked
    meter.feed(PREFACE + PING * int(FRAME_BURST))
    with pytest.raises(Abuse):
        meter.feed(PING)


def test_resets_cost_more_than_pings() -> None:
    meter = FrameMeter(Clock())
    meter.feed(PREFACE + RstStreamFrame(1).serialize() * int(FRAME_BURST / COSTLY))
    with pytest.raises(Abuse):
        meter.feed(RstStreamFrame(3).serialize())


def test_request_data_is_free_and_empty_data_is_not() -> None:
    meter = FrameMeter(Clock())
    meter.feed(PREFACE + DataFrame(1, data=b"x" * 100).serialize() * 10 * int(FRAME_BURST))
    with pytest.raises(Abuse):
        meter.feed(DataFrame(1, data=b"").serialize() * (int(FRAME_BURST) + 1))


def test_frames_cut_anywhere_are_read_the_same() -> None:
    wire = PREFACE + (DataFrame(1, data=b"y" * 37).serialize() + PING) * int(FRAME_BURST)
    meter = FrameMeter(Clock())
    for at in range(0, len(wire), 7):
        meter.feed(wire[at : at + 7])
    assert meter.tokens == 0 and meter.skip == 0 and not meter.head
    with pytest.raises(Abuse):
        meter.feed(PING)


def test_a_header_block_is_bounded_across_its_continuations() -> None:
    meter = FrameMeter(Clock())
    meter.feed(PREFACE + HeadersFrame(1, data=b"\x00" * 16000).serialize())
    meter.feed(ContinuationFrame(1, data=b"\x00" * (MAX_HEADER_BLOCK - 16000)).serialize())
    with pytest.raises(Abuse, match=f"a header block over {MAX_HEADER_BLOCK} bytes"):
        meter.feed(ContinuationFrame(1, data=b"\x00").serialize())
    ended = FrameMeter(Clock())  # each block counts on its own
    block = HeadersFrame(1, data=b"\x00" * 16000, flags=["END_HEADERS"]).serialize()
    ended.feed(PREFACE + block * 10)
