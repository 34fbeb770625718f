"""Stopping a process the runtime started: SIGTERM, then SIGKILL, and an answer to "is it gone?"."""

from __future__ import annotations

import _thread
import subprocess
import sys
import threading
import time

from rediacc_core import pids

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
)


def _started(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline() == b"1\n"  # its handler is set
    return process


def test_a_process_that_exits_on_sigterm_is_gone_within_the_timeout() -> None:
    process = _started("import time; print(1, flush=True); time.sleep(60)")
    start = time.monotonic()
    assert pids.stop_pid(process.pid, 10, process) is True
    assert time.monotonic() - start < 5 and process.returncode is not None


def test_one_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    process = _started(IGNORES_SIGTERM)
    assert pids.stop_pid(process.pid, 0.3, process) is True
    assert process.returncode == -9


def test_one_found_by_pid_alone_is_waited_for_until_it_is_gone() -> None:
    # Not our child as far as stop_pid knows (no Popen): it polls the pid, as `repo down` does for
    # an uplink that an earlier `rdc repo up` started.
    process = _started(IGNORES_SIGTERM)
    try:
        assert pids.stop_pid(process.pid, 0.3) is True
        assert not pids.pid_alive(process.pid)  # a zombie (nobody reaped it yet) is not alive
    finally:
        process.wait(5)


def test_a_pid_that_is_already_gone_is_gone() -> None:
    process = _started("print(1, flush=True)")
    process.wait(5)
    assert pids.stop_pid(process.pid, 0.3) is True


SLOW_TO_EXIT = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.8), sys.exit(0)))\n"
    "print(1, flush=True)\n"
    "time.sleep(60)"
)


def test_a_stop_interrupted_by_ctrl_c_still_sees_out_the_process_it_told_to_stop() -> None:
    """Ctrl-C while a stopped process winds down: the caller reports where things stand once that
    process is gone, not a moment before it goes (and a state that then changes by itself)."""
    process = _started(SLOW_TO_EXIT)
    timer = threading.Timer(0.2, _thread.interrupt_main)  # Ctrl-C 0.2 s into its 0.8 s exit
    timer.start()
    try:
        pids.stop_pid(process.pid, 10, process)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the Ctrl-C was lost")
    finally:
        timer.join()
    assert process.returncode == 0  # exited by itself, seen out, not killed


def test_a_second_ctrl_c_ends_the_wait_at_once() -> None:
    process = _started(IGNORES_SIGTERM)
    timers = [threading.Timer(at, _thread.interrupt_main) for at in (0.2, 0.5)]
    for timer in timers:
        timer.start()
    began = time.monotonic()
    try:
        pids.stop_pid(process.pid, 10, process)
    except KeyboardInterrupt:
        pass
    finally:
        for timer in timers:
            timer.join()
        process.kill()
        process.wait()
    assert time.monotonic() - began < pids.INTERRUPTED_GRACE
