"""The gate's log: refusals are written at once; admitted requests may wait a moment, never reorder."""

from __future__ import annotations

import asyncio

import pytest

from rediacc_core.gate.serve import GateLog


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
