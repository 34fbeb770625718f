"""A child is started and known, or not started: a Ctrl-C that comes while one starts waits until it
is known, and a command cut short stops every child it started, even one not yet recorded."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core.pids import pid_alive
from rediacc_core.runtime import process
from rediacc_core.runtime.process import Child, interrupts_deferred

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def ctrl_c_reaches_us() -> Iterator[None]:
    """Python's own SIGINT handler, whatever the test run inherited (a shell's background job
    starts with SIGINT ignored, and then no Ctrl-C reaches the process at all)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("ctrl_c_reaches_us")
def test_a_ctrl_c_inside_waits_for_the_end_of_the_block() -> None:
    reached = []
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("after the signal")
    assert reached == ["after the signal"]


def test_an_ignored_sigint_stays_ignored() -> None:
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_child_started_under_a_ctrl_c_is_known_and_stopped(tmp_path: Path) -> None:
    child = Child("sleeper", tmp_path / "sleeper.pid")
    process.forget_launched()
    started = child.start(SLEEPER, record=False)  # as the gate: it would write its own pidfile
    assert not child.pidfile.exists()
    stopped = process.stop_launched(5)
    assert stopped == [f"sleeper (pid {started.pid})"]
    assert started.poll() is not None and not pid_alive(started.pid)
    assert process.stop_launched(5) == []  # each only once


def test_children_a_finished_command_started_are_no_longer_its_to_stop(tmp_path: Path) -> None:
    child = Child("sleeper", tmp_path / "sleeper.pid")
    started = child.start(SLEEPER)
    try:
        process.forget_launched()
        assert process.stop_launched(5) == []
        assert started.poll() is None
    finally:
        started.kill()
        started.wait()
