"""One supervised child: a process a repo's runtime starts and later finds again by its pidfile.

A repo runs five: its dockerd and containerd, the gate, the uplink (slirp4netns) and the port
keeper. Each is started detached (it outlives the `rdc` that started it), named by a pidfile, and
found again by a later `rdc` (`repo list`, `repo down`, the next `repo up`). A pid is only the
process when it is alive (not a zombie) and, where the child has a `mark`, its command line holds
the mark: after a reboot or a crash the pidfile's number may belong to anyone. A stop waits for
the process to be gone (`pids.stop_pid`) and removes the pidfile.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rediacc_core.files import atomic_write_text
from rediacc_core.pids import pid_alive, stop_pid

if TYPE_CHECKING:
    import subprocess

# Every child this process started, in order: a command cut short by Ctrl-C stops those it started
# (`stop_launched`), even one whose pidfile is not written yet (the gate and dockerd write their own
# once ready, the uplink is recorded once it is).
_launched: list[tuple[str, subprocess.Popen[bytes]]] = []


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) back until the end of the block, then raise it: a child is never
    started without being known. Only the main thread receives signals; elsewhere it does nothing."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        None,
    ):
        yield  # no Ctrl-C reaches this process (a background job's SIGINT is ignored)
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):  # Python's own handler, or one that also notes it (`repo_up`)
            previous(signal.SIGINT, None)
        raise KeyboardInterrupt


def stop_launched(timeout: float) -> list[str]:
    """Stop every child this process started that still runs, the last started first; returns what
    was stopped ("dockerd (pid N)")."""
    stopped = []
    while _launched:
        what, process = _launched.pop()
        if process.poll() is None:
            stop_pid(process.pid, timeout, process)
            stopped.append(f"{what} (pid {process.pid})")
    return stopped


def forget_launched() -> None:
    """The children started so far are the machine's now (a command that finished its work)."""
    _launched.clear()


def read_pid(pidfile: Path) -> int | None:
    """The number a pidfile holds; None when there is none or it is not a number."""
    try:
        text = pidfile.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a child's log, for an error that says why it did not start."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@dataclass(frozen=True)
class Child:
    """A supervised child process, known by its pidfile."""

    what: str  # how messages name it: "dockerd", "the gate", "network uplink" ...
    pidfile: Path
    log: Path | None = None
    mark: str | None = None  # a string its command line holds, when its pid must be told from others

    def pid(self) -> int | None:
        """The pid of the running child; None when the pidfile names no live process that is it."""
        pid = read_pid(self.pidfile)
        if pid is None or not pid_alive(pid):
            return None
        if self.mark is not None and self.mark.encode() not in _command_line(pid):
            return None
        return pid

    def record(self, pid: int) -> None:
        """Write the pidfile of a child just started."""
        atomic_write_text(self.pidfile, f"{pid}\n")

    def forget(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.pidfile.unlink()

    def stop(self, timeout: float) -> int | None:
        """Stop the child (SIGTERM, then SIGKILL after `timeout`) and remove its pidfile; the pid
        stopped, or None when none ran. The pidfile stays when the process would not go."""
        pid = self.pid()
        if pid is None:
            self.forget()
            return None
        if stop_pid(pid, timeout):
            self.forget()
        return pid

    def start(
        self,
        argv: Sequence[str],
        *,
        detach: bool = True,
        record: bool = True,
        pass_fds: Sequence[int] = (),
    ) -> subprocess.Popen[bytes]:
        """Start the child with its output appended to its log (or discarded), and record its pid
        unless the child writes its pidfile itself. OSError when it cannot be run."""
        import subprocess  # late: a command that only reads pidfiles (`rdc repo list`) starts nothing

        out = open(self.log, "ab") if self.log is not None else None  # noqa: SIM115 - the child's
        try:
            with interrupts_deferred():  # started and known, or not started
                process = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out if out is not None else subprocess.DEVNULL,
                    stderr=subprocess.STDOUT,
                    start_new_session=detach,
                    pass_fds=tuple(pass_fds),
                )
                _launched.append((self.what, process))
                if record:
                    self.record(process.pid)
        finally:
            if out is not None:
                out.close()
        return process

    def log_tail(self, lines: int = 15) -> str:
        return log_tail(self.log, lines) if self.log is not None else "(no log)"
