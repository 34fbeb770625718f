"""Running one repo's gate: `python -m rediacc_core.runtime.serve ...`.

`rdc repo up` starts this in the background; `rdc repo gate` and `rdc repo up --foreground` run
it in the foreground (for systemd). SIGTERM or SIGINT closes the socket and every connection.
The gate runs in this process, or in as many worker processes as the machine's `gate-workers`
setting asks for (`workers.py`); `--workers` overrides the setting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rediacc_core.errors import RdcError
from rediacc_core.files import atomic_write_text
from rediacc_core.gate.audit.log import Audit
from rediacc_core.gate.decide.containers import DaemonContainers
from rediacc_core.gate.decide.decider import Decider
from rediacc_core.gate.decide.images import ImageConfigs
from rediacc_core.gate.server import GateServer, bind_listener, new_event_loop
from rediacc_core.machine import Machine
from rediacc_core.plugins import get_plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import lifecycle
from rediacc_core.runtime.health_watch import refresh_health
from rediacc_core.runtime.lapsed import refresh_telemetry, stop_lapsed_holders
from rediacc_core.runtime.layout import runtime_for
from rediacc_core.runtime.logfiles import LogKeeper
from rediacc_core.runtime.settings import MAX_WORKERS
from rediacc_core.runtime.workers import Publish, Supervisor
from rediacc_core.settings import effective, read_settings

_SECOND: list[int | str] = [-1, ""]  # the last second stamped and its text: formatted once a second


def _stamp() -> str:
    """Now, to the second, as the log writes it."""
    second = int(time.time())
    if second != _SECOND[0]:
        _SECOND[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))]
    return str(_SECOND[1])


def stderr_log(line: str) -> None:
    stamp = _stamp()
    sys.stderr.write(f"{stamp} {line}\n")
    sys.stderr.flush()


_ADMITTED_DELAY = 0.25  # seconds a line about an admitted request may wait before it is written
MAX_LOG_LINE = 1024  # characters of one log line; the rest is cut (a refused 200 KiB path is one line)
LOG_BURST = 100  # lines written back to back before the rate applies
LOG_RATE = 20.0  # lines a second after a burst; the others are counted and said in one line


class GateLog:
    """The gate's log on stderr: one timestamped line per event, in order.

    Refusals, errors and everything else are written at once: an operator reads them while a
    `docker run` fails. Lines about admitted requests, most of the log under load, are gathered on
    the event loop and written together at most `_ADMITTED_DELAY` later, which saves a write per
    admitted request. Whatever is gathered is written before any other line, and by `flush()`.

    A tenant chooses what its requests say, so each line is one physical line of at most
    `MAX_LOG_LINE` characters, and lines are rate-limited (a token bucket of `LOG_BURST` lines
    refilled at `LOG_RATE` a second); lines over the rate are dropped and their number is written
    once writing resumes. Every decision is still in the audit log (`rdc repo gate log`), whose
    size is bounded by rotation instead.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        max_line: int = MAX_LOG_LINE,
        burst: int = LOG_BURST,
        rate: float = LOG_RATE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._pending: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()  # decisions in worker threads log too
        self._max_line = max_line
        self._burst = float(burst)
        self._rate = rate
        self._clock = clock
        self._tokens = float(burst)
        self._refilled = clock()
        self.dropped = 0  # lines over the rate not yet reported

    def share(self, workers: int) -> None:
        """Keep to this worker's share of the rate, so that `workers` processes together keep to it."""
        self._burst = self._tokens = max(1.0, self._burst / workers)
        self._rate /= workers

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _admit(self, stamp: str) -> str | None:
        """Take a token (under the lock): None when the line is over the rate, else what to write
        before it (the note about lines dropped since the last one written)."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1:
            self.dropped += 1
            return None
        self._tokens -= 1
        if not self.dropped:
            return ""
        note = f"{stamp} {self.dropped} log lines dropped (over {self._rate:g} lines a second)\n"
        self.dropped = 0
        return note

    def __call__(self, line: str) -> None:
        stamp = _stamp()
        if len(line) > self._max_line:
            line = f"{line[: self._max_line]}... ({len(line) - self._max_line} more characters)"
        if "\n" in line or "\r" in line:
            line = line.replace("\r", "\\r").replace("\n", " | ")
        text = f"{stamp} {line}\n"
        if line.startswith("admitted "):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                with self._lock:
                    note = self._admit(stamp)
                    if note is None:
                        return
                    self._pending.append(note + text)
                    if self._timer is None:
                        self._timer = loop.call_later(_ADMITTED_DELAY, self.flush)
                return
        with self._lock:
            note = self._admit(stamp)
            if note is None:
                return
            self.stream.write("".join(self._pending) + note + text)
            self._pending.clear()
        self.stream.flush()

    def flush(self) -> None:
        with self._lock:
            self._timer = None
            if not self._pending:
                return
            self.stream.write("".join(self._pending))
            self._pending.clear()
        self.stream.flush()


def flush_log(gate: GateServer) -> None:
    if isinstance(gate.log, GateLog):
        gate.log.flush()


def build_gate(machine: Machine, repo: Repo, listen: Path, upstream: Path) -> GateServer:
    """The gate for `repo`, deciding with the core's decider and the installed plugins: every part
    of the decider is built here, at start, and those that ask the repo's daemon are handed its
    socket."""
    log = GateLog()
    decider = Decider(
        machine,
        repo,
        get_plugins(),
        ImageConfigs(upstream),
        log,
        containers=DaemonContainers(upstream),
        upstream=upstream,
    )
    restored = decider.restore_pins()
    if restored:
        log(f"pinned again {len(restored)} bind source(s) recorded before this gate started")
    stale = decider.spec_age()
    if stale:  # said at start; every device request is refused the same way until the refresh
        log(f"{stale}; device requests are refused until `rdc machine refresh {machine.name}`")
    runtime = runtime_for(machine, repo)
    audit = Audit(runtime.audit_log, repo.id, repo.name, lifecycle.metrics_file(machine, repo))
    return GateServer(listen, upstream, decider, log=log, repo_ref=repo.ref, audit=audit)


def raise_open_files_limit() -> None:
    """Every client connection holds two descriptors (its own and the daemon's): allow the most."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def log_keeper(machine: Machine, repo: Repo, log: Callable[[str], None]) -> LogKeeper:
    """Bounds the gate's log and, when the repo has a daemon of its own, that daemon's log; and
    applies the machine's `lease-end` setting to running containers whose grant ended; and brings the
    GPU telemetry (a lease ended) and the GPU health records up to date; and runs the plugins'
    chores (`rdc_housekeeping`: Slurm's reconciler and health sync, `slurm.plugin`)."""

    runtime = runtime_for(machine, repo)
    paths = [runtime.gate_log]
    if runtime.owns_daemon:
        paths.append(runtime.daemon_paths.log)
    plugins = get_plugins()
    chores = [
        lambda: stop_lapsed_holders(machine, repo, log),
        lambda: refresh_telemetry(machine, log),
        lambda: refresh_health(machine, plugins, log),
        *plugins.housekeeping(machine, repo.id, log),
    ]
    return LogKeeper(paths, report=log, chores=chores)


def run_gate(
    gate: GateServer,
    pidfile: Path | None = None,
    keeper: LogKeeper | None = None,
    *,
    listener: socket.socket | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT. The pidfile (when given) exists exactly while serving.

    With `listener`, this process is one worker of a gate (`workers.Supervisor`): it accepts on the
    socket its supervisor bound and leaves announcing the gate to it."""
    raise_open_files_limit()
    loop = new_event_loop()
    asyncio.set_event_loop(loop)
    worker = listener is not None

    async def main() -> None:
        await gate.start(listener)
        if pidfile is not None:
            atomic_write_text(pidfile, f"{os.getpid()}\n")
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        if not worker:
            stderr_log(f"gate for {gate.repo_ref} on {gate.listen_path} -> {gate.upstream_path}")
        await stop.wait()
        flush_log(gate)
        if not worker:
            stderr_log("stopping")
        await gate.close()

    if keeper is not None:
        keeper.start()
    try:
        loop.run_until_complete(main())
    finally:
        if keeper is not None:
            keeper.stop()
        flush_log(gate)
        if pidfile is not None and pidfile.exists():
            with contextlib.suppress(OSError, ValueError):
                if int(pidfile.read_text().strip()) == os.getpid():
                    pidfile.unlink()
        loop.close()


def run_workers(
    gate: GateServer, workers: int, pidfile: Path | None = None, keeper: LogKeeper | None = None
) -> int:
    """Serve `gate` from `workers` processes until SIGTERM/SIGINT (see `workers.py`); returns the exit
    status. The pidfile names the supervisor, which stops the workers when it is stopped."""
    raise_open_files_limit()
    gate.limits = gate.limits.share(workers)
    if isinstance(gate.log, GateLog):
        gate.log.share(workers)

    def serve(listener: socket.socket, publish: Publish) -> int:
        if gate.audit is not None:
            gate.audit.publish = publish
        run_gate(gate, listener=listener)
        return 0

    listener = bind_listener(gate.listen_path, gate.socket_mode)
    try:
        if pidfile is not None:
            atomic_write_text(pidfile, f"{os.getpid()}\n")
        where = f"{gate.listen_path} -> {gate.upstream_path}"
        stderr_log(f"gate for {gate.repo_ref} on {where} ({workers} worker processes)")
        audit = gate.audit
        supervisor = Supervisor(
            workers,
            listener,
            serve,
            log=stderr_log,
            metrics_path=None if audit is None else audit.metrics_path,
            labels="" if audit is None else audit.labels,
            keeper=keeper,
        )
        code = supervisor.run()
        stderr_log("stopped")
        return code
    finally:
        listener.close()
        with contextlib.suppress(FileNotFoundError):
            gate.listen_path.unlink()
        if pidfile is not None:
            with contextlib.suppress(OSError, ValueError):
                if int(pidfile.read_text().strip()) == os.getpid():
                    pidfile.unlink()


def configured_workers(machine: Machine) -> int:
    """How many processes the machine's `gate-workers` setting asks for (its default when the
    settings file cannot be read: the gate still starts, and its decisions report the file)."""
    try:
        return int(effective(read_settings(machine))["gate-workers"])
    except RdcError:
        return 1


def serve_repo(
    machine: Machine,
    repo: Repo,
    listen: Path,
    upstream: Path,
    pidfile: Path | None = None,
    *,
    workers: int | None = None,
    keep_logs: bool = False,
) -> int:
    """Build and run `repo`'s gate in as many processes as asked (the machine's setting when
    `workers` is None); with `keep_logs`, also keep its log files bounded. Returns the exit status."""
    gate = build_gate(machine, repo, listen, upstream)
    keeper = log_keeper(machine, repo, gate.log) if keep_logs else None
    count = configured_workers(machine) if workers is None else workers
    if count <= 1:
        run_gate(gate, pidfile, keeper)
        return 0
    return run_workers(gate, count, pidfile, keeper)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rediacc_core.runtime.serve", description=__doc__)
    parser.add_argument("--machine", required=True, help="machine name (for messages)")
    parser.add_argument("--root", required=True, type=Path, help="the machine's filesystem root")
    parser.add_argument("--repo-id", required=True)
    parser.add_argument("--listen", required=True, type=Path, help="the gate's socket")
    parser.add_argument("--upstream", required=True, type=Path, help="the daemon's socket")
    parser.add_argument("--pidfile", type=Path)
    parser.add_argument(
        "--workers", type=int, help="worker processes (default: the machine's gate-workers setting)"
    )
    args = parser.parse_args(argv)
    if args.workers is not None and not 1 <= args.workers <= MAX_WORKERS:
        parser.error(f"--workers must be from 1 to {MAX_WORKERS}")
    try:
        # Everything the gate reads (repos, grants, settings, inventory) is under the machine's root,
        # so it needs no client config and works whoever's HOME it runs with.
        machine = Machine(name=args.machine, root=args.root)
        repo = RepoStore(machine).by_id(args.repo_id)
        return serve_repo(
            machine, repo, args.listen, args.upstream, args.pidfile, workers=args.workers, keep_logs=True
        )
    except RdcError as exc:
        stderr_log(f"error: {exc.what}" + (f" -- {exc.todo}" if exc.todo else ""))
        return exc.exit_code
    except OSError as exc:
        stderr_log(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
