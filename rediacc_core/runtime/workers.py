"""One repo's gate as several processes: a supervisor and workers accepting on one socket.

Python runs one thread at a time, so one event loop proxies on one CPU at most; under many clients
the gate then waits on itself while CPUs sit idle. So a gate may run `count` workers: the
supervisor builds the gate once (plugins loaded, pins restored), binds its socket, and forks the
workers, which inherit both; each runs the gate's event loop on the shared socket, and the kernel
hands every new connection to one of them. Nothing a decision needs is kept between requests in a
worker's memory (grants, inventory and settings are files; caches only cache them), so any worker
may serve any request. What the workers do share is kept safe where it lives: the pins by a lock
on the pin directory (`gate.pins`), the audit log by a lock around each batch and rotation
(`gate.audit`), the log file by one `write()` per line, and the limits by each worker holding its
share (`GateLimits.share`).

The supervisor runs no event loop and no thread (so forking again is always safe). It waits on
signals and on one pipe per worker, through which each worker sends its counters every
`metrics.METRICS_INTERVAL` seconds; it adds them up into the repo's one metrics file (a stopped
worker's counts are kept, so counters never go back). It bounds the log files (`LogKeeper.check`),
starts a new worker when one dies (at most `MAX_RESTARTS` within `RESTART_WINDOW` seconds; past
that something is wrong that restarting will not fix, and the gate stops with an error), and on
SIGTERM or SIGINT stops the workers (SIGKILL after `STOP_TIMEOUT`), removes the socket and returns.
Each worker also gets SIGTERM if the supervisor dies (`PR_SET_PDEATHSIG`), so none outlives it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rediacc_core.gate.audit.metrics import METRICS_INTERVAL, Counters, metrics_text, write_metrics_file
from rediacc_core.runtime.logfiles import CHECK_INTERVAL, LogKeeper

MAX_RESTARTS = 5  # worker deaths tolerated within RESTART_WINDOW
RESTART_WINDOW = 60.0  # seconds
STOP_TIMEOUT = 10.0  # seconds the workers have to close their connections before SIGKILL
FIRST_METRICS = 1.0  # seconds after the start to the first metrics file, then every METRICS_INTERVAL

Publish = Callable[[Counters], None]
# What a worker runs: serve on the listener, hand counters to `publish`; returns an exit status.
ServeWorker = Callable[[socket.socket, Publish], int]

_PR_SET_PDEATHSIG = 1
_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)


@dataclass
class _Worker:
    slot: int
    pid: int
    pipe: int  # the read end of the worker's counters pipe
    pending: bytes = b""  # a counters line not yet complete


class Supervisor:
    """Runs `serve` in `count` forked workers until SIGTERM/SIGINT; see the module docstring."""

    def __init__(
        self,
        count: int,
        listener: socket.socket,
        serve: ServeWorker,
        *,
        log: Callable[[str], None],
        metrics_path: Path | None = None,
        labels: str = "",
        keeper: LogKeeper | None = None,
    ) -> None:
        self.count = count
        self.listener = listener
        self.serve = serve
        self.log = log
        self.metrics_path = metrics_path
        self.labels = labels
        self.keeper = keeper
        self.workers: dict[int, _Worker] = {}  # by pid
        self.latest: dict[int, Counters] = {}  # the last counters of each running worker, by slot
        self.retired = Counters()  # what workers that stopped counted
        self.exits: deque[float] = deque()  # when workers died unasked, within RESTART_WINDOW
        self.stopping = False
        self.failed = False
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._pid = os.getpid()

    # --- the supervisor's loop ----------------------------------------------------------------------
    def run(self) -> int:
        """Serve until told to stop; 0, or 1 when workers kept dying."""
        # The wakeup fd first: a signal that comes once a handler is in place must reach the loop.
        old_wakeup = signal.set_wakeup_fd(self._wake_w)
        previous = {sig: signal.signal(sig, _note) for sig in _SIGNALS}
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            for slot in range(self.count):
                self._start(slot)
            next_metrics = time.monotonic() + FIRST_METRICS  # the workers' first counters are in by then
            next_keep = time.monotonic() + CHECK_INTERVAL
            while not self.stopping:
                timeout = max(0.0, min(next_metrics, next_keep) - time.monotonic())
                self._wait(timeout)
                self._reap()
                now = time.monotonic()
                if now >= next_metrics:
                    self.write_metrics()
                    next_metrics = now + METRICS_INTERVAL
                if now >= next_keep:
                    if self.keeper is not None:
                        self.keeper.check()
                    next_keep = now + CHECK_INTERVAL
            self._stop_all()
        finally:
            if self.workers:  # the loop failed (a fork refused, say): no worker may serve on alone
                self.stopping = True
                with contextlib.suppress(Exception):
                    self._stop_all()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._selector.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        return 1 if self.failed else 0

    def _wait(self, timeout: float) -> None:
        for key, _ in self._selector.select(timeout):
            if key.fd == self._wake_r:
                self._signals()
            else:
                self._read(key.data)

    def _signals(self) -> None:
        with contextlib.suppress(BlockingIOError):
            for signum in os.read(self._wake_r, 512):
                if signum in (signal.SIGTERM, signal.SIGINT):
                    self.stopping = True

    def _read(self, worker: _Worker) -> None:
        try:
            data = os.read(worker.pipe, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._selector.unregister(worker.pipe)  # the worker is gone; `_reap` hears of it
            return
        *lines, worker.pending = (worker.pending + data).split(b"\n")
        for line in reversed(lines):  # only the newest whole line matters
            try:
                self.latest[worker.slot] = Counters.from_json(line)
                break
            except (ValueError, KeyError, TypeError):
                continue

    def _reap(self) -> None:
        while self.workers:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.pop(pid, None)
            if worker is None:
                continue
            self._retire(worker)
            if self.stopping:
                continue
            self.log(f"gate worker {worker.slot} (pid {pid}) {_how_it_ended(status)}; starting another")
            now = time.monotonic()
            self.exits.append(now)
            while self.exits and self.exits[0] < now - RESTART_WINDOW:
                self.exits.popleft()
            if len(self.exits) > MAX_RESTARTS:
                self.log(
                    f"error: gate workers ended {len(self.exits)} times within {RESTART_WINDOW:.0f}s; "
                    "stopping the gate (the lines above say why they ended)"
                )
                self.failed = self.stopping = True
                return
            self._start(worker.slot)

    def _retire(self, worker: _Worker) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(worker.pipe)
        self._drain(worker)
        os.close(worker.pipe)
        counted = self.latest.pop(worker.slot, None)
        if counted is not None:
            self.retired = self.retired.plus(counted.without_gauges())

    def _drain(self, worker: _Worker) -> None:
        """Read what the worker wrote before it ended (its last counters)."""
        os.set_blocking(worker.pipe, False)
        with contextlib.suppress(OSError):
            while True:
                data = os.read(worker.pipe, 65536)
                if not data:
                    break
                worker.pending += data
        *lines, worker.pending = worker.pending.split(b"\n")
        for line in reversed(lines):
            with contextlib.suppress(ValueError, KeyError, TypeError):
                self.latest[worker.slot] = Counters.from_json(line)
                break

    def _stop_all(self) -> None:
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        while self.workers and time.monotonic() < deadline:
            self._wait(0.05)
            self._reap()
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while self.workers:
            pid, _ = os.waitpid(-1, 0)
            worker = self.workers.pop(pid, None)
            if worker is not None:
                self._retire(worker)
        self.write_metrics()

    # --- counters --------------------------------------------------------------------------------
    def totals(self) -> Counters:
        """Every worker's counters added up, those of stopped workers included."""
        total = self.retired
        for counters in self.latest.values():
            total = total.plus(counters)
        return total

    def write_metrics(self) -> None:
        if self.metrics_path is not None:
            write_metrics_file(self.metrics_path, metrics_text(self.labels, self.totals()))

    # --- starting a worker -----------------------------------------------------------------------
    def _start(self, slot: int) -> None:
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        # Signals wait until the child has put its own handlers in place: until then they would run
        # the supervisor's and wake the supervisor's loop.
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            pid = os.fork()
        except OSError:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:
            os.close(read_end)
            self._become_worker(write_end)  # never returns
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        os.close(write_end)
        os.set_blocking(read_end, False)
        worker = _Worker(slot, pid, read_end)
        self.workers[pid] = worker
        self._selector.register(read_end, selectors.EVENT_READ, worker)

    def _become_worker(self, pipe: int) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for sig in _SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)  # blocked by `_start` for the fork
            _die_with_parent()
            self._selector.close()
            for fd in (self._wake_r, self._wake_w, *(w.pipe for w in self.workers.values())):
                with contextlib.suppress(OSError):
                    os.close(fd)
            if os.getppid() != self._pid:  # the supervisor died before the signal was asked for
                os._exit(0)
            code = self.serve(self.listener, _publisher(pipe))
        except BaseException:  # a worker ends here, never back in the supervisor's code
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _publisher(pipe: int) -> Publish:
    """Counters onto the pipe without ever blocking the worker's event loop: when the pipe is full
    (the supervisor is not reading), this update is dropped, and a cut line is ended so that the
    next one reads whole. Each line carries the totals, so the next one makes up for it."""
    os.set_blocking(pipe, False)
    cut = False

    def publish(counters: Counters) -> None:
        nonlocal cut
        data = ("\n" if cut else "") + counters.to_json() + "\n"
        encoded = data.encode()
        try:
            while encoded:
                encoded = encoded[os.write(pipe, encoded) :]
            cut = False
        except BlockingIOError:
            cut = True
        except OSError:  # the supervisor is gone: SIGTERM is on its way
            pass

    return publish


def _note(signum: int, frame: object) -> None:
    """The supervisor's signal handler: the wakeup fd carries the signal to its loop."""


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"
