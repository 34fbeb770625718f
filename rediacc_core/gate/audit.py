"""The gate's audit trail (one JSON line per decision) and its Prometheus counters.

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
logged in as and the client's address (`rediacc_core.gate.sshpeer`).
Requests that pass without a decision (reads, pings, logs, attach) are counted in the metrics, not
logged one by one: they are most of the traffic and carry nothing to decide.

Each line is at most `MAX_LINE` bytes (long fields are cut) and the file is rotated by size
(`audit.log` -> `audit.log.1` ... `.KEEP`), so a tenant cannot fill the disk through it. Lines are
gathered and written together at most `FLUSH_DELAY` later, one write for many decisions. A gate may
run as several worker processes (`rediacc_core.runtime.workers`) that share the file: each batch
is one `write()` made under a lock on `.audit.lock` beside it, after checking that the file is still
the one to append to and whether it is full, so lines never interleave and only one worker rotates.

The counters are written every `METRICS_INTERVAL` seconds, atomically (write, then rename), as a
node_exporter textfile-collector file: `<machine root>/run/rediacc/metrics/<repo id>.prom`, one
directory for every repo of the machine, so one `--collector.textfile.directory` collects them all.
A worker process hands its `Counters` to its supervisor instead, which adds them up and writes the
file (`publish`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import re
import socket
import struct
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import orjson

from rediacc_core.gate.sshpeer import ssh_client

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
    ssh: tuple[str, str] | None = None  # (user, client address) when sshd forwarded the connection

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"pid": self.pid, "uid": self.uid, "gid": self.gid}
        if self.ssh is not None:
            found["ssh"] = {"user": self.ssh[0], "client": self.ssh[1]}
        return found


NO_PEER = Peer(0, -1, -1)


def peer_of(transport: Any) -> Peer:
    """SO_PEERCRED of a Unix-socket transport; `NO_PEER` where it cannot be read."""
    sock = transport.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return NO_PEER
    pid, uid, gid = struct.unpack("3i", raw)
    found = ssh_client(pid, uid)  # a tunnelled request: name the SSH client, not only sshd
    return Peer(pid, uid, gid, None if found is None else (found["user"], found.get("client", "?")))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_FIELD else f"{text[:MAX_FIELD]}... ({len(text) - MAX_FIELD} more)"


_SECOND: list[Any] = [-1, ""]  # the last whole second formatted, and its text


def _stamp(now: float) -> str:
    second = int(now)
    if second != _SECOND[0]:
        _SECOND[:] = [second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))]
    return f"{_SECOND[1]}.{int(now * 1000) % 1000:03d}Z"


@dataclass
class Counters:
    """What the metrics file reports: counters only grow; the gauges are what holds now.

    Worker processes of one gate each count their own, and their supervisor adds them up (`plus`);
    they travel between the two as JSON (`to_json`, `from_json`).
    """

    requests: int = 0  # request heads read
    open_connections: int = 0  # gauge
    buffered: int = 0  # gauge: bytes of unfinished requests held
    decisions: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (endpoint, rule, result)
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0

    def plus(self, other: Counters) -> Counters:
        decisions = dict(self.decisions)
        for key, count in other.decisions.items():
            decisions[key] = decisions.get(key, 0) + count
        return Counters(
            requests=self.requests + other.requests,
            open_connections=self.open_connections + other.open_connections,
            buffered=self.buffered + other.buffered,
            decisions=decisions,
            latency_counts=[a + b for a, b in zip(self.latency_counts, other.latency_counts, strict=True)],
            latency_sum=self.latency_sum + other.latency_sum,
        )

    def without_gauges(self) -> Counters:
        """These counters as a worker that has stopped leaves them: its connections are gone."""
        return Counters(
            self.requests, 0, 0, dict(self.decisions), list(self.latency_counts), self.latency_sum
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "requests": self.requests,
                "open_connections": self.open_connections,
                "buffered": self.buffered,
                "decisions": [[*key, count] for key, count in self.decisions.items()],
                "latency_counts": self.latency_counts,
                "latency_sum": self.latency_sum,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Counters:
        """Raises ValueError (or KeyError, TypeError) when `text` is not what `to_json` wrote."""
        document = json.loads(text)
        counts = [int(n) for n in document["latency_counts"]]
        if len(counts) != len(LATENCY_BUCKETS) + 1:
            raise ValueError("latency_counts has the wrong number of buckets")
        return cls(
            requests=int(document["requests"]),
            open_connections=int(document["open_connections"]),
            buffered=int(document["buffered"]),
            decisions={(str(e), str(r), str(d)): int(n) for e, r, d, n in document["decisions"]},
            latency_counts=counts,
            latency_sum=float(document["latency_sum"]),
        )


def metrics_text(labels: str, counters: Counters) -> str:
    """`counters` in Prometheus' text format (version 0.0.4); `labels` name the repo."""
    out = [
        "# HELP rediacc_gate_requests_total Requests whose head the gate read.",
        "# TYPE rediacc_gate_requests_total counter",
        f"rediacc_gate_requests_total{{{labels}}} {counters.requests}",
        "# HELP rediacc_gate_decisions_total Decisions by endpoint, refusing rule and result.",
        "# TYPE rediacc_gate_decisions_total counter",
    ]
    for (endpoint, rule, result), count in sorted(counters.decisions.items()):
        out.append(
            f'rediacc_gate_decisions_total{{{labels},endpoint="{_label(endpoint)}",'
            f'rule="{_label(rule)}",result="{result}"}} {count}'
        )
    out += [
        "# HELP rediacc_gate_decision_seconds Time from a decided request's head to its decision.",
        "# TYPE rediacc_gate_decision_seconds histogram",
    ]
    running = 0
    for bound, count in zip((*LATENCY_BUCKETS, float("inf")), counters.latency_counts, strict=True):
        running += count
        le = "+Inf" if bound == float("inf") else repr(bound)
        out.append(f'rediacc_gate_decision_seconds_bucket{{{labels},le="{le}"}} {running}')
    out += [
        f"rediacc_gate_decision_seconds_sum{{{labels}}} {counters.latency_sum:.6f}",
        f"rediacc_gate_decision_seconds_count{{{labels}}} {running}",
        "# HELP rediacc_gate_open_connections Client connections open now.",
        "# TYPE rediacc_gate_open_connections gauge",
        f"rediacc_gate_open_connections{{{labels}}} {counters.open_connections}",
        "# HELP rediacc_gate_buffered_bytes Bytes of unfinished requests held now.",
        "# TYPE rediacc_gate_buffered_bytes gauge",
        f"rediacc_gate_buffered_bytes{{{labels}}} {counters.buffered}",
    ]
    return "\n".join(out) + "\n"


def repo_labels(repo_id: str, repo_name: str) -> str:
    return f'repo_id="{_label(repo_id)}",repo="{_label(repo_name)}"'


def write_metrics_file(path: Path, text: str) -> None:
    """Replace the metrics file atomically: node_exporter never reads half a file. Best effort:
    metrics never stop the gate (the audit log is the record)."""
    # A name of this process's own: two gates for one repo (the benchmark runs two) never write one
    # temporary file together.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o644)  # node_exporter often runs as its own user
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()


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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
