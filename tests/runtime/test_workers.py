"""A gate in several worker processes: every worker serves, the supervisor keeps them running and
stops them, and what they share (metrics, audit log, pins, limits) stays whole.

The gate runs as `rdc repo up` runs it (`python -m rediacc_core.runtime.serve`, real processes),
in front of a real HTTP server standing in for the daemon. To know which worker served a request,
the others are stopped with SIGSTOP: a stopped process accepts nothing, so whatever answers is the
one left running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proxy_kit import Handler, Upstream, read_response

from rediacc_core.gate.audit import read
from rediacc_core.gate.audit.log import Audit
from rediacc_core.gate.audit.metrics import Counters
from rediacc_core.gate.audit.peer import Peer
from rediacc_core.gate.server import GateLimits, bind_listener
from rediacc_core.gate.wire.decode import MAX_INSPECTED_BODY
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import layout, lifecycle, workers
from rediacc_core.runtime.settings import MAX_WORKERS, check_worker_setting
from rediacc_core.runtime.workers import Supervisor
from rediacc_core.settings import set_setting
from rediacc_core.testing import FakeMachine

PRIVILEGED = json.dumps({"Image": "x", "HostConfig": {"Privileged": True}}).encode()


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return sorted(found)


def alive(pid: int) -> bool:
    try:
        state = (Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(what: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def exchange(sock_path: Path, request: bytes, timeout: float = 10.0) -> int:
    """One request on a new connection; its response status."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(sock_path))
        sock.sendall(request)
        status, _ = read_response(sock)
        return status


PING = b"GET /_ping HTTP/1.1\r\nHost: docker\r\n\r\n"
CREATE = (
    b"POST /v1.45/containers/create HTTP/1.1\r\nHost: docker\r\nContent-Type: application/json\r\n"
    b"Content-Length: " + str(len(PRIVILEGED)).encode() + b"\r\n\r\n" + PRIVILEGED
)


class Gate:
    """`python -m rediacc_core.runtime.serve --workers N` for one repo, in front of `Upstream`."""

    def __init__(
        self, machine: Machine, repo: Repo, directory: Path, upstream: Path, count: int | None
    ) -> None:
        self.machine, self.repo = machine, repo
        self.sock = directory / "gate.sock"
        self.pidfile = directory / "gate.pid"
        self.log = directory / "gate.log"
        argv = [
            sys.executable, "-m", "rediacc_core.runtime.serve", "--machine", machine.name,
            "--root", str(machine.root), "--repo-id", repo.id, "--listen", str(self.sock),
            "--upstream", str(upstream), "--pidfile", str(self.pidfile),
        ]  # fmt: skip
        if count is not None:
            argv += ["--workers", str(count)]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log)
        wait_for(lambda: self.pidfile.exists() or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.log.read_text()
        wait_for(lambda: exchange(self.sock, PING) == 200)

    @property
    def workers(self) -> list[int]:
        """The supervisor's live children (a worker that died and is not reaped yet is not one)."""
        return [pid for pid in children(self.proc.pid) if alive(pid)]

    def wait_workers(self, count: int, gone: int | None = None) -> list[int]:
        """The workers, once there are `count` of them and `gone` is not among them: one reading of
        /proc, so that a worker dying or starting between two readings cannot mislead the test."""
        found: list[int] = []

        def ready() -> bool:
            found[:] = self.workers
            return len(found) == count and gone not in found

        wait_for(ready)
        return found

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(30)

    def metrics(self) -> str:
        return lifecycle.metrics_file(self.machine, self.repo).read_text()

    def audit_entries(self) -> list[dict[str, object]]:
        return list(read.read_entries(layout.runtime_for(self.machine, self.repo).audit_log))


@contextlib.contextmanager
def only(pid: int, others: list[int]) -> Iterator[None]:
    """Only worker `pid` can accept while inside (the others are stopped)."""
    for other in others:
        if other != pid:
            os.kill(other, signal.SIGSTOP)
    try:
        yield
    finally:
        for other in others:
            if other != pid:
                os.kill(other, signal.SIGCONT)


@pytest.fixture
def upstream(short_dir: Path) -> Iterator[Path]:
    path = short_dir / "daemon.sock"
    server = Upstream(str(path), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()


@pytest.fixture
def start(
    fake_machine: FakeMachine, short_dir: Path, upstream: Path, rdc_config: Path
) -> Iterator[Callable[[int | None], Gate]]:
    machine = fake_machine.machine
    repo = RepoStore(machine).create("alpha", None, docker_host=f"unix://{upstream}")
    started: list[Gate] = []

    def make(count: int | None) -> Gate:
        gate = Gate(machine, repo, short_dir, upstream, count)
        started.append(gate)
        return gate

    yield make
    for gate in started:
        with contextlib.suppress(Exception):
            gate.stop()
        for pid in children(gate.proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- serving ----------------------------------------------------------------------------------
def test_every_worker_accepts_on_the_one_socket_and_decides_alike(
    start: Callable[[int | None], Gate],
) -> None:
    gate = start(2)
    pids = gate.wait_workers(2)
    assert gate.pidfile.read_text().strip() == str(gate.proc.pid)
    for pid in pids:
        with only(pid, pids):
            assert exchange(gate.sock, PING) == 200
            assert exchange(gate.sock, CREATE) == 403  # each decides with the real decider


def test_one_worker_is_the_gate_in_one_process(start: Callable[[int | None], Gate]) -> None:
    gate = start(1)
    assert gate.workers == [] and exchange(gate.sock, PING) == 200


def test_by_default_the_gate_runs_in_one_process(start: Callable[[int | None], Gate]) -> None:
    gate = start(None)
    assert gate.workers == [] and exchange(gate.sock, CREATE) == 403


def test_the_machine_setting_chooses_how_many(
    start: Callable[[int | None], Gate], fake_machine: FakeMachine
) -> None:
    set_setting(fake_machine.machine, "gate-workers", "3")
    gate = start(None)
    gate.wait_workers(3)


def test_stopping_the_supervisor_stops_every_worker_and_removes_the_socket_and_pidfile(
    start: Callable[[int | None], Gate],
) -> None:
    gate = start(2)
    pids = gate.wait_workers(2)
    assert gate.stop() == 0
    assert not any(alive(pid) for pid in pids)
    assert not gate.sock.exists() and not gate.pidfile.exists()
    assert "(2 worker processes)" in gate.log.read_text()


def test_workers_end_when_the_supervisor_is_killed(start: Callable[[int | None], Gate]) -> None:
    gate = start(2)
    pids = gate.wait_workers(2)
    gate.proc.kill()
    gate.proc.wait()
    wait_for(lambda: not any(alive(pid) for pid in pids))


def test_a_worker_that_dies_is_replaced_and_the_gate_keeps_serving(
    start: Callable[[int | None], Gate],
) -> None:
    gate = start(2)
    first, second = gate.wait_workers(2)
    os.kill(first, signal.SIGKILL)
    now = gate.wait_workers(2, gone=first)
    replacement = next(pid for pid in now if pid != second)
    with only(replacement, now):
        assert exchange(gate.sock, PING) == 200
    assert "was killed by SIGKILL; starting another" in gate.log.read_text()


# --- what the workers share -------------------------------------------------------------------
def test_the_metrics_file_adds_up_every_workers_counters_also_of_a_worker_that_stopped(
    start: Callable[[int | None], Gate],
) -> None:
    gate = start(2)
    first, second = gate.wait_workers(2)
    for pid, creates in ((first, 3), (second, 4)):
        with only(pid, [first, second]):
            for _ in range(creates):
                assert exchange(gate.sock, CREATE) == 403
    os.kill(first, signal.SIGTERM)  # a worker's counters reach the supervisor as it stops
    gate.wait_workers(2, gone=first)
    assert exchange(gate.sock, PING) == 200  # a worker stopping leaves its siblings' socket in place
    assert gate.stop() == 0
    text = gate.metrics()
    refused = [
        line
        for line in text.splitlines()
        if line.startswith("rediacc_gate_decisions_total") and "refused" in line
    ]
    assert sum(int(line.rsplit(" ", 1)[1]) for line in refused) == 7
    assert len([e for e in gate.audit_entries() if e["decision"] == "refused"]) == 7


def test_counters_add_up_and_travel_as_json() -> None:
    one = Counters(requests=3, open_connections=2, buffered=10, decisions={("e", "r", "refused"): 2})
    one.latency_counts[0] = 1
    two = Counters(
        requests=4, decisions={("e", "r", "refused"): 1, ("e", "", "admitted"): 5}, latency_sum=0.5
    )
    total = Counters.from_json(one.to_json()).plus(two)
    assert (total.requests, total.open_connections, total.buffered) == (7, 2, 10)
    assert total.decisions == {("e", "r", "refused"): 3, ("e", "", "admitted"): 5}
    assert total.latency_counts[0] == 1 and total.latency_sum == 0.5
    assert one.without_gauges().open_connections == 0 == one.without_gauges().buffered


@pytest.mark.parametrize("text", ["", "{}", '{"requests": 1}', "[1]", "not json"])
def test_counters_that_are_not_what_a_worker_writes_are_refused(text: str) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        Counters.from_json(text)


_APPENDER = """
import sys
from pathlib import Path
from rediacc_core.gate.audit.log import Audit
from rediacc_core.gate.audit.peer import Peer
log = Audit(Path(sys.argv[1]), "id-1", "alpha", max_bytes=int(sys.argv[3]), keep=1000)
for n in range(int(sys.argv[4])):
    log.record(Peer(0, 0, 0), "POST", f"/{sys.argv[2]}/{n}", status=403, message="x" * 200)
log.close()
"""


def test_processes_sharing_an_audit_log_rotate_it_once_and_lose_or_break_no_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    writers = [
        subprocess.Popen([sys.executable, "-c", _APPENDER, str(path), name, "4000", "400"]) for name in "ab"
    ]
    assert [w.wait(60) for w in writers] == [0, 0]
    paths = [e["path"] for e in read.read_entries(path, keep=1000)]
    for name in "ab":
        assert [p for p in paths if str(p).startswith(f"/{name}/")] == [f"/{name}/{n}" for n in range(400)]
    files = [path, *sorted(tmp_path.glob("audit.log.*"), key=lambda p: int(p.suffix[1:]))]
    assert all(f.stat().st_size <= 4000 for f in files)
    for f in files:  # every line whole
        assert all(json.loads(line) for line in f.read_text().splitlines())


def test_an_audit_log_moved_away_by_another_process_is_reopened(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = Audit(path, "id-1", "alpha")
    log.record(Peer(0, 0, 0), "GET", "/first", status=403)
    os.replace(path, tmp_path / "audit.log.1")  # as another worker's rotation does
    log.record(Peer(0, 0, 0), "GET", "/second", status=403)
    log.close()
    assert [e["path"] for e in read.read_entries(path)] == ["/first", "/second"]


# --- the supervisor on its own ----------------------------------------------------------------
def test_workers_that_keep_dying_stop_the_gate_with_an_error(short_dir: Path) -> None:
    listener = bind_listener(short_dir / "s.sock")
    lines: list[str] = []
    with listener:
        status = Supervisor(2, listener, lambda sock, publish: 3, log=lines.append).run()
    assert status == 1
    assert sum("exited with status 3; starting another" in line for line in lines) == workers.MAX_RESTARTS + 1
    assert lines[-1].startswith(f"error: gate workers ended {workers.MAX_RESTARTS + 1} times")


def test_a_worker_hands_its_counters_to_the_supervisor_which_writes_the_metrics_file(short_dir: Path) -> None:
    listener = bind_listener(short_dir / "s.sock")
    metrics = short_dir / "m.prom"

    def serve(sock: socket.socket, publish: workers.Publish) -> int:
        publish(Counters(requests=5, decisions={("ping", "", "admitted"): 5}))
        os.kill(os.getppid(), signal.SIGTERM)  # then the supervisor stops everything
        time.sleep(30)
        return 0

    with listener:
        supervisor = Supervisor(1, listener, serve, log=print, metrics_path=metrics, labels='repo="a"')
        assert supervisor.run() == 0
    assert 'rediacc_gate_requests_total{repo="a"} 5' in metrics.read_text()


# --- settings and limits -----------------------------------------------------------------------
@pytest.mark.parametrize("value", ["0", "17", "-1", "2.5", "two", "auto", "\u0662", ""])
def test_a_worker_count_outside_1_to_16_is_refused(value: str) -> None:
    assert check_worker_setting(value) is not None


def test_workers_share_the_gates_limits_so_together_they_hold_no_more() -> None:
    limits = GateLimits(max_connections=4096, max_buffered=64 * 1024 * 1024)
    share = limits.share(3)
    assert share.max_connections * 3 <= 4096 and share.max_buffered * 3 <= 64 * 1024 * 1024
    assert (share.head_timeout, share.body_timeout) == (limits.head_timeout, limits.body_timeout)


def test_even_the_most_workers_each_hold_room_for_the_largest_body_the_gate_decides() -> None:
    assert GateLimits().share(MAX_WORKERS).max_buffered >= MAX_INSPECTED_BODY


def test_a_worker_never_waits_on_a_supervisor_that_does_not_read_its_counters() -> None:
    read_end, write_end = os.pipe()
    publish = workers._publisher(write_end)
    big = Counters(requests=1, decisions={(f"endpoint-{n}", "rule", "refused"): n for n in range(40)})

    def flood() -> None:
        for n in range(2000):  # far more than the pipe holds
            big.requests = n
            publish(big)

    flooding = threading.Thread(target=flood, daemon=True)
    flooding.start()
    flooding.join(10)
    assert not flooding.is_alive(), "publishing blocked on a full pipe"
    with contextlib.suppress(BlockingIOError):
        os.set_blocking(read_end, False)
        while os.read(read_end, 65536):
            pass
    big.requests = 4242
    publish(big)  # once the supervisor reads again, the next line arrives whole
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(read_end, 65536):
            data += chunk
    assert Counters.from_json(data.split(b"\n")[-2]).requests == 4242
    os.close(read_end)
    os.close(write_end)


def test_a_worker_that_cannot_be_started_stops_the_others(
    short_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listener = bind_listener(short_dir / "s.sock")
    real_fork = os.fork
    forked: list[int] = []

    def fork() -> int:
        if len(forked) == 1:
            raise BlockingIOError(11, "Resource temporarily unavailable")
        pid = real_fork()
        forked.append(pid)
        return pid

    def serve(sock: socket.socket, publish: workers.Publish) -> int:
        time.sleep(60)
        return 0

    monkeypatch.setattr(os, "fork", fork)
    supervisor = Supervisor(2, listener, serve, log=print)
    with listener, pytest.raises(BlockingIOError):
        supervisor.run()
    assert not supervisor.workers and not alive(forked[0])


def test_the_metrics_file_is_there_soon_after_the_start(start: Callable[[int | None], Gate]) -> None:
    gate = start(2)
    wait_for(
        lambda: lifecycle.metrics_file(gate.machine, gate.repo).exists(), timeout=workers.FIRST_METRICS + 5
    )
    assert "rediacc_gate_requests_total" in gate.metrics()
