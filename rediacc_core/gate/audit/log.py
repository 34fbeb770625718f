"""The gate's audit trail: one JSON line per decision, written in batches under a lock, rotated by size.

Every request whose body the gate decides (container create and update, exec, volumes, builds,
plugins, services...) and every request the gate refuses, for whatever reason, is one line of
`audit.log` beside the repo's `gate.log`:

    {"time": "2026-12-01T04:00:00.123Z", "repo": {"id": "...", "name": "alpha"},
     "peer": {"pid": 4242, "uid": 1000, "gid": 1000}, "method": "POST",
     "endpoint": "container-create", "path": "/v1.45/containers/create",
     "decision": "refused", "status": 403, "rules": ["grant"],
     "cdi_asked": ["vendor.example/gpu=1"], "cdi_admitted": [], "ms": 0.41, "message": "..."}

`peer` is what the kernel says about the client process (SO_PEERCRED, read once per connection);
for a request sshd forwarded (a tunnel from a laptop) it also holds `ssh`: the user the SSH client
logged in as and the client's address (`rediacc_core.gate.audit.sshpeer`).
Requests that pass without a decision (reads, pings, logs, attach) are counted in the metrics, not
logged one by one: they are most of the traffic and carry nothing to decide.

Each line is at most `MAX_LINE` bytes (long fields are cut) and the file is rotated by size
(`audit.log` -> `audit.log.1` ... `.KEEP`), so a tenant cannot fill the disk through it. Lines are
gathered and written together at most `FLUSH_DELAY` later, one write for many decisions. A gate may
run as several worker processes (`rediacc_core.runtime.workers`) that share the file: each batch
is one `write()` made under a lock on `.audit.lock` beside it, after checking that the file is still
the one to append to and whether it is full, so lines never interleave and only one worker rotates.

The counters each decision adds to are in `metrics`; reading the trail back is `read`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import orjson

from rediacc_core.gate.audit.metrics import (
    LATENCY_BUCKETS,
    METRICS_INTERVAL,
    Counters,
    metrics_text,
    repo_labels,
    write_metrics_file,
)
from rediacc_core.gate.audit.peer import Peer

MAX_LINE = 4096  # bytes of one audit line
MAX_FIELD = 512  # characters of one free-text field (path, message) before it is cut
MAX_NAMES = 32  # CDI names listed in one line
MAX_BYTES = 16 * 1024 * 1024  # audit.log is rotated past this size
KEEP = 4  # rotated files kept: audit.log.1 .. audit.log.4
FLUSH_DELAY = 0.25  # seconds a line may wait to be written with others


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD else f"{text[:MAX_FIELD]}... ({len(text) - MAX_FIELD} more)"


_SECOND: list[Any] = [-1, ""]  # the last whole second formatted, and its text


def _stamp(now: float) -> str:
    second = int(now)
    if second != _SECOND[0]:
        _SECOND[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return f"{_SECOND[1]}.{int(now * 1000) % 1000:03d}Z"


def lock_path(path: Path) -> Path:
    """The lock that the writers of audit file `path` take around each batch and rotation."""
    return path.with_name(f".{path.name.split('.')[0]}.lock")


class Audit:
    """Audit lines and counters of one repo's gate. Called on the event loop (and from decision
    threads only through the loop), so the counters need no lock; the file writes take one, which
    other worker processes of the same gate take too (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        repo_id: str,
        repo_name: str,
        metrics_path: Path | None = None,
        *,
        max_bytes: int = MAX_BYTES,
        keep: int = KEEP,
    ) -> None:
        self.path = path
        self.metrics_path = metrics_path
        self.repo = {"id": repo_id, "name": repo_name}
        self.max_bytes = max_bytes
        self.keep = keep
        # Where the counters go every METRICS_INTERVAL; None: rendered into `metrics_path`. A worker
        # process of a gate sets it to hand them to its supervisor.
        self.publish: Callable[[Counters], None] | None = None
        self._pending: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._metrics_timer: asyncio.TimerHandle | None = None
        # counters
        self.decisions: dict[tuple[str, str, str], int] = {}  # (endpoint, rule, result) -> count
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.labels = repo_labels(repo_id, repo_name)

    # --- recording --------------------------------------------------------------------------------
    def record(
        self,
        peer: Peer,
        method: str,
        target: str,
        *,
        status: int,
        endpoint: str = "",
        rules: Iterable[str] = (),
        cdi_asked: Iterable[str] = (),
        cdi_admitted: Iterable[str] = (),
        message: str = "",
        seconds: float | None = None,
    ) -> None:
        """One decision: a line for the file and its counters."""
        admitted = status < 400
        rule_ids = list(rules)
        result = "admitted" if admitted else "refused"
        path = target.split("?", 1)[0]
        entry: dict[str, Any] = {
            "time": _stamp(time.time()),
            "repo": self.repo,
            "peer": peer.to_json(),
            "method": _cut(method),
            "endpoint": endpoint,
            "path": _cut(path),
            "decision": result,
            "status": status,
            "rules": rule_ids[:MAX_NAMES],
            "cdi_asked": list(cdi_asked)[:MAX_NAMES],
            "cdi_admitted": list(cdi_admitted)[:MAX_NAMES],
        }
        if seconds is not None:
            entry["ms"] = round(seconds * 1000, 3)
            self.latency_counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self.latency_sum += seconds
        if message:
            entry["message"] = _cut(message)
        line = _json_line(entry)
        if len(line) > MAX_LINE // 4:  # characters can take up to 4 bytes: check the real size
            line = _bounded(entry, line)
        for rule in rule_ids or [""]:
            key = (endpoint, rule, result)
            self.decisions[key] = self.decisions.get(key, 0) + 1
        self._queue(line + "\n")

    def _queue(self, line: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._pending.append(line)
            if loop is None:
                self._write_pending()
            elif self._timer is None:
                self._timer = loop.call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        with self._lock:
            self._timer = None
            self._write_pending()

    def _write_pending(self) -> None:
        """Write what is gathered in one `write()` (the thread lock is held), under the file lock
        that other processes writing this file take too, rotating first when the file is full."""
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()  # before anything can fail: a line that cannot be written is not kept
        data = text.encode("utf-8", "backslashreplace")
        try:
            if self._lock_fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._lock_fd = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                fd = self._current()
                size = os.fstat(fd).st_size
                if size and size + len(data) > self.max_bytes:
                    fd = self._rotate()
                while data:
                    data = data[os.write(fd, data) :]
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        except OSError:
            self._close_files()  # retried with the next batch; the gate never stops for its audit log

    def _current(self) -> int:
        """The descriptor to append to: `path` as it is now (another process may have rotated it)."""
        if self._fd is not None:
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            held = os.fstat(self._fd)
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                return self._fd
            os.close(self._fd)
            self._fd = None
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        return self._fd

    def _rotate(self) -> int:
        for n in range(self.keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
        os.replace(self.path, f"{self.path}.1")
        return self._current()

    def _close_files(self) -> None:
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fd = self._lock_fd = None

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._close_files()

    # --- metrics ----------------------------------------------------------------------------------
    def counters(self, requests: int, open_connections: int, buffered: int) -> Counters:
        """This gate's counters now, with the gauges the server reports beside them."""
        return Counters(
            requests=requests,
            open_connections=open_connections,
            buffered=buffered,
            decisions=dict(self.decisions),
            latency_counts=list(self.latency_counts),
            latency_sum=self.latency_sum,
        )

    def metrics_text(self, requests: int, open_connections: int, buffered: int) -> str:
        """The counters in Prometheus' text format (version 0.0.4)."""
        return metrics_text(self.labels, self.counters(requests, open_connections, buffered))

    def write_metrics(self, requests: int, open_connections: int, buffered: int) -> None:
        """Hand the counters to `publish`, or replace the metrics file with them."""
        if self.publish is not None:
            self.publish(self.counters(requests, open_connections, buffered))
        elif self.metrics_path is not None:
            write_metrics_file(self.metrics_path, self.metrics_text(requests, open_connections, buffered))

    def start_metrics(self, gauges: Callable[[], tuple[int, int, int]]) -> None:
        """Write the metrics now and every METRICS_INTERVAL seconds (on the running loop)."""
        if self.metrics_path is None and self.publish is None:
            return
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.write_metrics(*gauges())
            self._metrics_timer = loop.call_later(METRICS_INTERVAL, tick)

        tick()

    def stop_metrics(self, gauges: Callable[[], tuple[int, int, int]]) -> None:
        if self._metrics_timer is not None:
            self._metrics_timer.cancel()
            self._metrics_timer = None
        self.write_metrics(*gauges())


def append_event(
    path: Path, repo: dict[str, str], *, endpoint: str, decision: str, cdi: Iterable[str], message: str
) -> None:
    """One line for something `rdc` itself did to the repo (a handover), appended under the lock the
    gate's writers take; `rdc repo gate log` shows it among the decisions."""
    entry: dict[str, Any] = {
        "time": _stamp(time.time()),
        "repo": repo,
        "method": "rdc",
        "peer": {"pid": os.getpid(), "uid": os.getuid()},  # the rdc command that did it
        "endpoint": endpoint,
        "decision": decision,
        "status": 0,
        "rules": [],
        "cdi_asked": list(cdi)[:MAX_NAMES],
        "cdi_admitted": [],
        "message": _cut(message),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = os.open(lock_path(path), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with open(path, "a", encoding="utf-8") as f:
            f.write(_json_line(entry) + "\n")
    finally:
        os.close(lock)


def _json_line(entry: dict[str, Any]) -> str:
    """`entry` as compact JSON that encodes to UTF-8, whatever the request held.

    orjson takes a tenth of the standard library's time per decision. What it refuses is a lone
    surrogate, which a request can put in a message (a query value's undecodable byte, kept by
    `surrogateescape`): that line is written by the standard library as ASCII, the surrogate as a
    `\\udcxx` escape, so the line can still be written and read back.
    """
    try:
        return orjson.dumps(entry).decode("utf-8")
    except orjson.JSONEncodeError:
        return json.dumps(entry, ensure_ascii=True, separators=(",", ":"))


def _bounded(entry: dict[str, Any], line: str) -> str:
    """`line` cut to MAX_LINE bytes by shortening its free-text fields, never by breaking the JSON."""
    while len(line.encode()) > MAX_LINE:
        longest = max(("message", "path", "method"), key=lambda k: len(str(entry.get(k, ""))))
        text = str(entry.get(longest, ""))
        if len(text) <= 16:
            entry["cdi_asked"], entry["cdi_admitted"] = entry["cdi_asked"][:4], entry["cdi_admitted"][:4]
            entry["rules"] = entry["rules"][:4]
        entry[longest] = text[: len(text) // 2] + "..."
        line = _json_line(entry)
    return line
