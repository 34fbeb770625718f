"""The gate's log: refusals are written at once; admitted requests may wait a moment, never reorder."""

from __future__ import annotations

import asyncio
import io

import pytest

from rediacc_core.runtime.serve import GateLog


def lines(text: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in text.splitlines()]


def test_a_refusal_is_written_at_once_and_after_the_admissions_before_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = GateLog()

    async def serve() -> list[str]:
        log("admitted POST /containers/create")
        log("admitted POST /containers/create with CDI devices vendor.example/gpu=0")
        assert capsys.readouterr().err == ""  # gathered, not yet written
        log("403 POST /containers/create: no grant")
        return lines(capsys.readouterr().err)

    assert asyncio.run(serve()) == [
        "admitted POST /containers/create",
        "admitted POST /containers/create with CDI devices vendor.example/gpu=0",
        "403 POST /containers/create: no grant",
    ]


def test_admitted_requests_are_written_shortly_after(capsys: pytest.CaptureFixture[str]) -> None:
    log = GateLog()

    async def serve() -> None:
        log("admitted POST /volumes/create")
        await asyncio.sleep(0.5)

    asyncio.run(serve())
    assert lines(capsys.readouterr().err) == ["admitted POST /volumes/create"]


def test_outside_an_event_loop_every_line_is_written_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    GateLog()("admitted POST /volumes/create")
    assert lines(capsys.readouterr().err) == ["admitted POST /volumes/create"]


def test_flush_writes_what_is_gathered(capsys: pytest.CaptureFixture[str]) -> None:
    log = GateLog()

    async def serve() -> None:
        log("admitted POST /volumes/create")
        log.flush()
        assert lines(capsys.readouterr().err) == ["admitted POST /volumes/create"]

    asyncio.run(serve())


def test_a_long_line_is_cut_to_the_limit_and_says_how_much_was_cut() -> None:
    written = io.StringIO()
    GateLog(written, max_line=100)("refused 403 POST /containers/create?name=" + "n" * 5000)
    (line,) = lines(written.getvalue())
    assert line.startswith("refused 403 POST /containers/create?name=nnn")
    assert line.endswith("... (4941 more characters)")


def test_a_multi_line_message_is_written_as_one_line() -> None:
    written = io.StringIO()
    GateLog(written)("403 POST /containers/create: first problem\nsecond problem\r\nthird")
    assert lines(written.getvalue()) == [
        "403 POST /containers/create: first problem | second problem\\r | third"
    ]


def test_lines_over_the_rate_are_dropped_and_counted_in_the_next_line_written() -> None:
    written = io.StringIO()
    now = [0.0]
    log = GateLog(written, burst=3, rate=2.0, clock=lambda: now[0])  # three at once, then two a second
    for n in range(10):
        log(f"refused {n}")
    assert lines(written.getvalue()) == ["refused 0", "refused 1", "refused 2"]
    assert log.dropped == 7
    now[0] = 0.5  # one line's worth of time later
    log("refused 10")
    log("refused 11")
    assert lines(written.getvalue())[3:] == ["7 log lines dropped (over 2 lines a second)", "refused 10"]
    assert log.dropped == 1
