"""The gate's audit trail (one JSON line per decision) and its Prometheus counters.

Every request whose body the gate decides (container create and update, exec, volumes, builds,
plugins, services...) and every request the gate refuses, for whatever reason, is one line of
`audit.log` beside the repo's `gate.log`:

    {"time": "2026-12-01T04:00:00.123Z", "repo": {"id": "...", "name": "alpha"},
     "peer": {"pid": 4242, "uid": 1000, "gid": 1000}, "method": "POST",
     "endpoint": "container-create", "path": "/v1.45/containers/create",
     "decision": "refused", "status": 403, "rules": ["grant"],
     "cdi_asked": ["vendor.example/gpu=1"], "cdi_admitted": [], "ms": 0.41, "message": "..."}

`peer` is what the kernel says about the client process (SO_PEERCRED, read once per connection).
Requests that pass without a decision (reads, pings, logs, attach) are counted in the metrics, not
logged one by one: they are most of the traffic and carry nothing to decide.

Each line is at most `MAX_LINE` bytes (long fields are cut) and the file is rotated by size
(`audit.log` -> `audit.log.1` ... `.KEEP`), so a tenant cannot fill the disk through it. Lines are
gathered and written together at most `FLUSH_DELAY` later, one write for many decisions.

The counters are written every `METRICS_INTERVAL` seconds, atomically (write, then rename), as a
node_exporter textfile-collector file: `<machine root>/run/rediacc/metrics/<repo id>.prom`, one
directory for every repo of the machine, so one `--collector.textfile.directory` collects them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, TextIO

MAX_LINE = 4096  # bytes of one audit line
MAX_FIELD = 512  # characters of one free-text field (path, message) before it is cut
MAX_NAMES = 32  # CDI names listed in one line
MAX_BYTES = 16 * 1024 * 1024  # audit.log is rotated past this size
KEEP = 4  # rotated files kept: audit.log.1 .. audit.log.4
FLUSH_DELAY = 0.25  # seconds a line may wait to be written with others
METRICS_INTERVAL = 10.0  # seconds between two writes of the metrics file
# Upper bounds (seconds) of the decision-latency histogram's buckets.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class Peer:
    """The client process of a connection, as the kernel recorded it when it connected."""

    pid: int
    uid: int
    gid: int


NO_PEER = Peer(0, -1, -1)


def peer_of(transport: Any) -> Peer:
    """SO_PEERCRED of a Unix-socket transport; `NO_PEER` where it cannot be read."""
    sock = transport.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return NO_PEER
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD else f"{text[:MAX_FIELD]}... ({len(text) - MAX_FIELD} more)"


_SECOND: list[Any] = [-1, ""]  # the last whole second formatted, and its text


def _stamp(now: float) -> str:
    second = int(now)
    if second != _SECOND[0]:
        _SECOND[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return f"{_SECOND[1]}.{int(now * 1000) % 1000:03d}Z"


class Audit:
    """Audit lines and counters of one repo's gate. Called on the event loop (and from decision
    threads only through the loop), so the counters need no lock; the file writes take one."""

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
        self._pending: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._size = 0
        self._metrics_timer: asyncio.TimerHandle | None = None
        # counters
        self.decisions: dict[tuple[str, str, str], int] = {}  # (endpoint, rule, result) -> count
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self._labels = f'repo_id="{_label(repo_id)}",repo="{_label(repo_name)}"'

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
            "peer": {"pid": peer.pid, "uid": peer.uid, "gid": peer.gid},
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
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
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
        """Write what is gathered (the lock is held), rotating first when the file is full."""
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending.clear()
        try:
            if self._file is None:
                self._open()
            if self._size and self._size + len(text) > self.max_bytes:
                self._rotate()
            assert self._file is not None
            self._file.write(text)
            self._file.flush()
            self._size += len(text.encode())
        except OSError:
            self._file = None  # retried with the next batch; the gate never stops for its audit log

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._file = os.fdopen(fd, "a", encoding="utf-8")
        self._size = os.fstat(fd).st_size

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        for n in range(self.keep - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self.path}.{n}", f"{self.path}.{n + 1}")
        os.replace(self.path, f"{self.path}.1")
        self._open()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    # --- metrics ----------------------------------------------------------------------------------
    def metrics_text(self, requests: int, open_connections: int, buffered: int) -> str:
        """The counters in Prometheus' text format (version 0.0.4)."""
        labels = self._labels
        out = [
            "# HELP rediacc_gate_requests_total Requests whose head the gate read.",
            "# TYPE rediacc_gate_requests_total counter",
            f"rediacc_gate_requests_total{{{labels}}} {requests}",
            "# HELP rediacc_gate_decisions_total Decisions by endpoint, refusing rule and result.",
            "# TYPE rediacc_gate_decisions_total counter",
        ]
        for (endpoint, rule, result), count in sorted(self.decisions.items()):
            out.append(
                f'rediacc_gate_decisions_total{{{labels},endpoint="{_label(endpoint)}",'
                f'rule="{_label(rule)}",result="{result}"}} {count}'
            )
        out += [
            "# HELP rediacc_gate_decision_seconds Time from a decided request's head to its decision.",
            "# TYPE rediacc_gate_decision_seconds histogram",
        ]
        running = 0
        for bound, count in zip((*LATENCY_BUCKETS, float("inf")), self.latency_counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            out.append(f'rediacc_gate_decision_seconds_bucket{{{labels},le="{le}"}} {running}')
        out += [
            f"rediacc_gate_decision_seconds_sum{{{labels}}} {self.latency_sum:.6f}",
            f"rediacc_gate_decision_seconds_count{{{labels}}} {running}",
            "# HELP rediacc_gate_open_connections Client connections open now.",
            "# TYPE rediacc_gate_open_connections gauge",
            f"rediacc_gate_open_connections{{{labels}}} {open_connections}",
            "# HELP rediacc_gate_buffered_bytes Bytes of unfinished requests held now.",
            "# TYPE rediacc_gate_buffered_bytes gauge",
            f"rediacc_gate_buffered_bytes{{{labels}}} {buffered}",
        ]
        return "\n".join(out) + "\n"

    def write_metrics(self, requests: int, open_connections: int, buffered: int) -> None:
        """Replace the metrics file atomically: node_exporter never reads half a file."""
        if self.metrics_path is None:
            return
        text = self.metrics_text(requests, open_connections, buffered)
        tmp = self.metrics_path.with_name(f".{self.metrics_path.name}.tmp")
        try:
            self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text, encoding="utf-8")
            os.chmod(tmp, 0o644)  # node_exporter often runs as its own user
            os.replace(tmp, self.metrics_path)
        except OSError:
            pass  # metrics are best effort; the audit log is the record

    def start_metrics(self, gauges: Callable[[], tuple[int, int, int]]) -> None:
        """Write the metrics file now and every METRICS_INTERVAL seconds (on the running loop)."""
        if self.metrics_path is None:
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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _bounded(entry: dict[str, Any], line: str) -> str:
    """`line` cut to MAX_LINE bytes by shortening its free-text fields, never by breaking the JSON."""
    while len(line.encode()) > MAX_LINE:
        longest = max(("message", "path", "method"), key=lambda k: len(str(entry.get(k, ""))))
        text = str(entry.get(longest, ""))
        if len(text) <= 16:
            entry["cdi_asked"], entry["cdi_admitted"] = entry["cdi_asked"][:4], entry["cdi_admitted"][:4]
            entry["rules"] = entry["rules"][:4]
        entry[longest] = text[: len(text) // 2] + "..."
        line = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
    return line


# --- reading (rdc repo gate log) ------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(s|m|h|d)")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float | None = None) -> float:
    """`--since`: a duration back from now (`90s`, `15m`, `2h`, `1d`) or a timestamp
    (`2026-12-01T04:00:00Z`, `2026-12-01`; UTC unless it names a zone). Raises ValueError."""
    now = time.time() if now is None else now
    match = _DURATION.fullmatch(text.strip())
    if match:
        return now - float(match.group(1)) * _UNITS[match.group(2)]
    stamp = datetime.fromisoformat(text.strip())
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def entry_time(entry: dict[str, Any]) -> float:
    try:
        return datetime.fromisoformat(str(entry["time"])).timestamp()
    except (KeyError, ValueError):
        return 0.0


def _entries(lines: Iterable[str], since: float | None) -> Iterator[dict[str, Any]]:
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash mid-write
        if isinstance(entry, dict) and (since is None or entry_time(entry) >= since):
            yield entry


def read_entries(path: Path, since: float | None = None, keep: int = KEEP) -> Iterator[dict[str, Any]]:
    """Every audit entry in `path` and its rotated files, oldest first, from `since` on."""
    for n in range(keep, 0, -1):
        with contextlib.suppress(FileNotFoundError), open(f"{path}.{n}", encoding="utf-8") as old:
            yield from _entries(old, since)
    with contextlib.suppress(FileNotFoundError), open(path, encoding="utf-8") as current:
        yield from _entries(current, since)


def follow_entries(
    path: Path, since: float | None = None, poll: float = 0.5, stop: Callable[[], bool] = lambda: False
) -> Iterator[dict[str, Any]]:
    """`read_entries`, then every entry appended from then on (across rotations) until `stop()`."""
    for n in range(KEEP, 0, -1):
        with contextlib.suppress(FileNotFoundError), open(f"{path}.{n}", encoding="utf-8") as old:
            yield from _entries(old, since)
    handle: TextIO | None = None
    inode = -1
    partial = ""
    while not stop():
        if handle is None:
            try:
                handle = open(path, encoding="utf-8")  # noqa: SIM115 - kept open across polls
                inode = os.fstat(handle.fileno()).st_ino
            except FileNotFoundError:
                time.sleep(poll)
                continue
        chunk = handle.read()
        if chunk:
            partial += chunk
            *whole, partial = partial.split("\n")
            yield from _entries(whole, since)
            continue
        try:
            rotated = os.stat(path).st_ino != inode
        except FileNotFoundError:
            rotated = True
        if rotated:
            handle.close()
            handle = None  # the rest of the old file was read above; the new one starts at 0
            continue
        time.sleep(poll)
    if handle is not None:
        handle.close()
