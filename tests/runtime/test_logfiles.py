"""The gate's and its dockerd's log files stay bounded while their writers keep appending."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rediacc_core.machine import Machine
from rediacc_core.repos import Repo
from rediacc_core.runtime import layout
from rediacc_core.runtime.logfiles import LogKeeper, bound, previous
from rediacc_core.runtime.serve import log_keeper

# A writer like the gate or dockerd: its stdout is the log file, opened for appending by its parent.
_WRITER = """
import sys, time
n = 0
while True:
    line = sys.stdin.readline()
    if not line:
        break
    for _ in range(int(line)):
        sys.stdout.write(f"line {n:06d} " + "x" * 50 + "\\n")
        n += 1
    sys.stdout.flush()
    print("done", file=sys.stderr, flush=True)
"""


class Writer:
    def __init__(self, log: Path) -> None:
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WRITER],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
            )

    def write(self, lines: int) -> None:
        """Append `lines` lines and wait until they are in the file."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.write(f"{lines}\n")
        self.proc.stdin.flush()
        assert self.proc.stderr.readline().strip() == "done"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[tuple[Writer, Path]]:
    log = tmp_path / "gate.log"
    w = Writer(log)
    yield w, log
    w.close()


LINE = len("line 000000 " + "x" * 50 + "\n")


def test_a_log_under_its_bound_is_left_alone(writer: tuple[Writer, Path]) -> None:
    w, log = writer
    w.write(10)
    assert not bound(log, max_bytes=10 * LINE)
    assert log.stat().st_size == 10 * LINE
    assert not previous(log).exists()


def test_a_log_over_its_bound_moves_to_dot_1_and_its_writer_carries_on_at_the_start(
    writer: tuple[Writer, Path],
) -> None:
    w, log = writer
    w.write(100)
    assert bound(log, max_bytes=50 * LINE)
    kept = previous(log).read_text().splitlines()
    assert len(kept) == 100 and kept[0].startswith("line 000000") and kept[-1].startswith("line 000099")
    assert log.stat().st_size == 0
    w.write(3)
    # Appending, the writer lands at the new end: no hole of zeros where the old content was.
    assert log.read_text().splitlines() == [f"line {n:06d} " + "x" * 50 for n in range(100, 103)]


def test_the_previous_copy_is_replaced_not_grown(writer: tuple[Writer, Path]) -> None:
    w, log = writer
    w.write(60)
    assert bound(log, max_bytes=50 * LINE)
    w.write(70)
    assert bound(log, max_bytes=50 * LINE)
    kept = previous(log).read_text().splitlines()
    assert len(kept) == 70 and kept[0].startswith("line 000060")
    assert not list(log.parent.glob("*.tmp"))


def test_a_missing_log_is_not_an_error(tmp_path: Path) -> None:
    assert not bound(tmp_path / "never-written.log", max_bytes=1)


def test_the_keeper_bounds_its_files_on_its_own_thread(writer: tuple[Writer, Path]) -> None:
    w, log = writer
    said: list[str] = []
    keeper = LogKeeper(
        [log, log.parent / "absent.log"], max_bytes=20 * LINE, interval=0.01, report=said.append
    )
    keeper.start()
    try:
        w.write(40)
        deadline = time.monotonic() + 10
        while not previous(log).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        keeper.stop()
    assert previous(log).exists()
    assert said and said[0].startswith(f"{log} was over {20 * LINE} bytes")


def test_the_keeper_says_what_it_could_not_do_and_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "gate.log"
    log.write_text("x" * 100)
    previous(log).mkdir()  # the copy cannot replace a directory
    said: list[str] = []
    LogKeeper([log], max_bytes=10, report=said.append).check()
    assert said and said[0].startswith(f"could not bound {log}")
    assert log.read_text() == "x" * 100  # nothing cut that was not kept


def test_the_gate_keeps_its_own_log_and_its_own_daemons(tmp_path: Path) -> None:
    machine = Machine("m1", tmp_path)
    own = Repo(
        id="id-1", name="alpha", tag=None, machine="m1", docker_host=None, created_at="2026-01-01T00:00:00Z"
    )
    runtime = layout.runtime_for(machine, own)
    assert log_keeper(machine, own, print).paths == (runtime.gate_log, runtime.daemon_paths.log)
    shared = Repo(
        id="id-2",
        name="beta",
        tag=None,
        machine="m1",
        docker_host="unix:///run/docker.sock",
        created_at="2026-01-01T00:00:00Z",
    )
    assert log_keeper(machine, shared, print).paths == (layout.runtime_for(machine, shared).gate_log,)
