"""One supervised child: found again by its pidfile, told apart from a process that reused its pid,
stopped and forgotten."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from rediacc_core.runtime.process import Child, log_tail, read_pid

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_no_pidfile_or_no_number_is_no_child(tmp_path: Path) -> None:
    child = Child("sleeper", tmp_path / "sleeper.pid")
    assert child.pid() is None
    child.pidfile.write_text("not a pid\n")
    assert read_pid(child.pidfile) is None and child.pid() is None


def test_a_dead_pid_is_no_child(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    child = Child("sleeper", tmp_path / "sleeper.pid")
    child.record(gone.pid)
    assert child.pid() is None


def test_started_it_is_found_logs_and_stops_with_its_pidfile(tmp_path: Path) -> None:
    child = Child("talker", tmp_path / "talker.pid", tmp_path / "talker.log")
    argv = [sys.executable, "-c", "import sys, time; print('ready', flush=True); time.sleep(60)"]
    process = child.start(argv)
    try:
        assert child.pid() == process.pid == read_pid(child.pidfile)
        deadline = time.monotonic() + 30
        while "ready" not in log_tail(tmp_path / "talker.log") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.log_tail() == "ready"
        assert child.stop(5) == process.pid
        assert not child.pidfile.exists() and child.pid() is None
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def test_a_pid_reused_by_another_program_is_not_the_child(tmp_path: Path) -> None:
    stranger = subprocess.Popen(SLEEPER)
    try:
        marked = Child("uplink", tmp_path / "uplink.pid", mark="/run/netns/rdc-0123")
        marked.record(stranger.pid)  # as after a reboot: the number now names someone else
        assert marked.pid() is None
        assert marked.stop(1) is None and stranger.poll() is None  # never stopped: it is not ours
        assert not marked.pidfile.exists()
        unmarked = Child("sleeper", tmp_path / "sleeper.pid")
        unmarked.record(stranger.pid)
        assert unmarked.pid() == stranger.pid
    finally:
        stranger.kill()
        stranger.wait(10)


def test_stopping_what_never_ran_says_so(tmp_path: Path) -> None:
    assert Child("gate", tmp_path / "gate.pid").stop(1) is None
