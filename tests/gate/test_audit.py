"""The gate's audit trail: one bounded JSON line per decision, rotated by size, with the client's
credentials; and its Prometheus counters."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from proxy_kit import Env, gate_env, read_response

from rediacc_core.gate.audit import log, peer, read
from rediacc_core.gate.audit.log import MAX_LINE, Audit
from rediacc_core.gate.audit.peer import Peer

PEER = Peer(4242, 1000, 1001)
Loop = Callable[[], asyncio.AbstractEventLoop]


def entries(path: Path) -> list[dict[str, object]]:
    return list(read.read_entries(path))


# --- what a decision says ------------------------------------------------------------------------
def test_a_refused_device_request_names_its_rule_and_the_cdi_names_asked(gate: Any) -> None:
    decision = gate.create({"Image": "x", "HostConfig": {"Devices": [], "DeviceRequests": [
        {"Driver": "cdi", "DeviceIDs": ["vendor.example/gpu=1"]}]}})  # fmt: skip
    assert not decision.forward
    assert decision.endpoint == "container-create"
    assert decision.rules == ("grant",)
    assert decision.cdi_asked == ("vendor.example/gpu=1",) and decision.cdi_admitted == ()


def test_an_admitted_device_request_names_the_cdi_names_admitted(gate: Any) -> None:
    gate.grant("vendor.example/gpu=0")
    decision = gate.create({"Image": "x", "HostConfig": {"DeviceRequests": [
        {"Driver": "cdi", "DeviceIDs": ["vendor.example/gpu=0"]}]}})  # fmt: skip
    assert decision.forward and decision.rules == ()
    assert decision.cdi_asked == decision.cdi_admitted == ("vendor.example/gpu=0",)


def test_a_privileged_request_names_the_refusing_rule(gate: Any) -> None:
    decision = gate.create({"Image": "x", "HostConfig": {"Privileged": True}})
    assert not decision.forward and decision.rules and all(decision.rules)


def test_a_request_the_gate_cannot_read_is_refused_under_the_bad_request_rule(gate: Any) -> None:
    decision = gate.post("/v1.45/containers/create?name=%zz", {"Image": "x"})
    assert (decision.status, decision.rules) == (400, ("bad-request",))


# --- the file ------------------------------------------------------------------------------------
def test_a_decision_is_one_json_line_with_who_asked_what(tmp_path: Path) -> None:
    log = Audit(tmp_path / "audit.log", "id-1", "alpha")
    log.record(
        PEER, "POST", "/v1.45/containers/create?name=x", status=403, endpoint="container-create",
        rules=("grant",), cdi_asked=("vendor.example/gpu=1",), message="no grant", seconds=0.0004,
    )  # fmt: skip
    (line,) = (tmp_path / "audit.log").read_text().splitlines()
    entry = json.loads(line)
    assert entry["repo"] == {"id": "id-1", "name": "alpha"}
    assert entry["peer"] == {"pid": 4242, "uid": 1000, "gid": 1001}
    assert (entry["method"], entry["endpoint"], entry["path"]) == (
        "POST",
        "container-create",
        "/v1.45/containers/create",
    )
    assert (entry["decision"], entry["status"], entry["rules"]) == ("refused", 403, ["grant"])
    assert (entry["cdi_asked"], entry["cdi_admitted"]) == (["vendor.example/gpu=1"], [])
    assert entry["ms"] == 0.4 and entry["message"] == "no grant"
    assert entry["time"].endswith("Z") and abs(read.entry_time(entry) - time.time()) < 60


def test_a_line_never_exceeds_its_bound_whatever_the_request_holds(tmp_path: Path) -> None:
    log = Audit(tmp_path / "audit.log", "id-1", "alpha")
    log.record(PEER, "POST", "/containers/create?" + "n" * 200_000, status=400, message="é" * 100_000,
               cdi_asked=[f"vendor.example/gpu={'x' * 200}{n}" for n in range(1000)])  # fmt: skip
    (line,) = (tmp_path / "audit.log").read_bytes().splitlines()
    assert len(line) <= MAX_LINE
    assert json.loads(line)["status"] == 400


def test_a_message_with_an_undecodable_byte_is_written_and_so_is_everything_after_it(tmp_path: Path) -> None:
    # A query value's byte 0xff reaches refusal messages as a lone surrogate (surrogateescape).
    log = Audit(tmp_path / "audit.log", "id-1", "alpha")
    log.record(PEER, "POST", "/v1.45/build?networkmode=%ff", status=403, message="build networkmode=\udcff")
    log.record(PEER, "GET", "/v1.45/containers/json", status=200)
    first, second = [json.loads(line) for line in (tmp_path / "audit.log").read_text().splitlines()]
    assert first["message"] == "build networkmode=\udcff" and second["path"] == "/v1.45/containers/json"


def test_the_file_is_rotated_by_size_and_read_back_oldest_first(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = Audit(path, "id-1", "alpha", max_bytes=2000, keep=2)
    for n in range(100):
        log.record(PEER, "POST", f"/containers/create?n={n}", status=200, endpoint=f"e{n}")
    sizes = [p.stat().st_size for p in (path, Path(f"{path}.1"), Path(f"{path}.2"))]
    assert all(size <= 2000 for size in sizes) and not Path(f"{path}.3").exists()
    kept = [e["endpoint"] for e in read.read_entries(path, keep=2)]
    assert kept == [f"e{n}" for n in range(100 - len(kept), 100)]  # the newest, in order


def test_lines_on_the_event_loop_are_written_together_shortly_after(tmp_path: Path) -> None:
    trail = Audit(tmp_path / "audit.log", "id-1", "alpha")

    async def serve() -> None:
        trail.record(PEER, "POST", "/a", status=200)
        trail.record(PEER, "POST", "/b", status=403)
        assert not (tmp_path / "audit.log").exists()  # gathered
        await asyncio.sleep(log.FLUSH_DELAY * 2)

    asyncio.run(serve())
    assert [e["path"] for e in entries(tmp_path / "audit.log")] == ["/a", "/b"]


@pytest.mark.parametrize(
    ("text", "back"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1.5h", 5400)],
)
def test_since_takes_a_duration_back_from_now(text: str, back: float) -> None:
    assert read.parse_since(text, now=100_000.0) == 100_000.0 - back


def test_since_takes_a_timestamp_in_utc_unless_it_names_a_zone() -> None:
    assert read.parse_since("2026-12-01T04:00:00Z") == read.parse_since("2026-12-01T04:00:00")
    assert read.parse_since("2026-12-01T05:00:00+01:00") == read.parse_since("2026-12-01T04:00:00")
    with pytest.raises(ValueError):
        read.parse_since("yesterday")


def test_since_keeps_only_later_entries(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text(
        '{"time": "2026-12-01T04:00:00.000Z", "path": "/old"}\n'
        "a line cut by a crash\n"
        '{"time": "2026-12-01T05:00:00.000Z", "path": "/new"}\n'
    )
    since = read.parse_since("2026-12-01T04:30:00Z")
    assert [e["path"] for e in read.read_entries(path, since)] == ["/new"]


def test_follow_reads_what_is_appended_across_a_rotation(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = Audit(path, "id-1", "alpha", max_bytes=600, keep=3)
    log.record(PEER, "POST", "/first", status=200)
    seen: list[str] = []
    done = threading.Event()

    def follow() -> None:
        for entry in read.follow_entries(path, poll=0.02, stop=done.is_set):
            seen.append(str(entry["path"]))

    reader = threading.Thread(target=follow)
    reader.start()
    for n in range(8):  # two rotations
        log.record(PEER, "POST", f"/next{n}", status=200)
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while len(seen) < 9 and time.monotonic() < deadline:
        time.sleep(0.02)
    done.set()
    reader.join(10)
    assert seen == ["/first", *(f"/next{n}" for n in range(8))]


# --- the counters ---------------------------------------------------------------------------------
def test_counters_are_written_atomically_in_prometheus_text_format(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics" / "id-1.prom"
    log = Audit(tmp_path / "audit.log", "id-1", "alpha", metrics)
    log.record(PEER, "POST", "/c", status=200, endpoint="container-create", seconds=0.0007)
    log.record(PEER, "POST", "/c", status=403, endpoint="container-create", rules=("grant", "privileged"))
    log.write_metrics(12, 3, 4096)
    text = metrics.read_text()
    assert [p.name for p in metrics.parent.iterdir()] == ["id-1.prom"]  # no temporary file left
    labels = 'repo_id="id-1",repo="alpha"'
    assert f"rediacc_gate_requests_total{{{labels}}} 12" in text
    assert (
        f'rediacc_gate_decisions_total{{{labels},endpoint="container-create",rule="",result="admitted"}} 1'
        in text
    )
    refused = f'{labels},endpoint="container-create",rule="grant",result="refused"'
    assert f"rediacc_gate_decisions_total{{{refused}}} 1" in text
    assert f'rediacc_gate_decision_seconds_bucket{{{labels},le="0.0005"}} 0' in text
    assert f'rediacc_gate_decision_seconds_bucket{{{labels},le="0.001"}} 1' in text
    assert f'rediacc_gate_decision_seconds_bucket{{{labels},le="+Inf"}} 1' in text
    assert f"rediacc_gate_open_connections{{{labels}}} 3" in text
    assert f"rediacc_gate_buffered_bytes{{{labels}}} 4096" in text
    assert all(line.startswith(("# HELP ", "# TYPE ", "rediacc_gate_")) for line in text.splitlines())


# --- through the proxy ---------------------------------------------------------------------------
@contextlib.contextmanager
def audited(short_dir: Path, new_loop: Loop, log: Audit) -> Iterator[Env]:
    yield from gate_env(short_dir, new_loop, audit=log)


def test_the_gate_records_each_decision_with_the_client_process_credentials(
    short_dir: Path, new_loop: Loop
) -> None:
    path = short_dir / "audit.log"
    metrics = short_dir / "m.prom"
    with audited(short_dir, new_loop, Audit(path, "id-1", "alpha", metrics)) as env:
        sock = env.connect()
        for body in (b'{"Image": "bb"}', b'{"Privileged": true}'):
            sock.sendall(
                b"POST /containers/create HTTP/1.1\r\nHost: d\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            read_response(sock)
        sock.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")  # not decided: counted, not logged
        read_response(sock)
        sock.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\nContent-Length: x\r\n\r\n")  # bad framing
        read_response(sock)
    found = entries(path)
    assert [(e["decision"], e["status"]) for e in found] == [
        ("admitted", 200),
        ("refused", 403),
        ("refused", 400),
    ]
    assert all(e["peer"] == {"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid()} for e in found)
    assert found[2]["rules"] == ["http"]
    assert "rediacc_gate_requests_total" in metrics.read_text()


def test_refusals_by_the_gate_limits_are_recorded(short_dir: Path, new_loop: Loop) -> None:
    from rediacc_core.gate.server import GateLimits

    path = short_dir / "audit.log"
    with contextlib.contextmanager(gate_env)(
        short_dir, new_loop, limits=GateLimits(max_connections=1), audit=Audit(path, "id-1", "alpha")
    ) as env:
        first = env.connect()
        first.sendall(b"GET /_ping HTTP/1.1\r\nHost: d\r\n\r\n")
        read_response(first)
        second = env.connect()
        assert read_response(second)[0] == 503
    (entry,) = entries(path)
    assert (entry["status"], entry["rules"]) == (503, ["limit"])


# --- where the audit trail cannot be written or read as usual ------------------------------------
class _Transport:
    def __init__(self, sock: object) -> None:
        self.sock = sock

    def get_extra_info(self, name: str) -> object:
        return self.sock if name == "socket" else None


def test_the_peer_is_the_process_at_the_other_end_of_the_unix_socket() -> None:
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert peer.peer_of(_Transport(ours)) == Peer(os.getpid(), os.getuid(), os.getgid())
    finally:
        ours.close()
        theirs.close()
    assert peer.peer_of(_Transport(None)) == peer.NO_PEER  # no socket to ask: not a failure


def test_an_audit_file_that_cannot_be_written_is_retried_with_the_next_batch(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the audit directory should be")
    log = Audit(blocker / "audit.log", "id-1", "alpha")
    log.record(PEER, "GET", "/_ping", status=200)  # written at once outside a loop: fails quietly
    log.flush()  # nothing pending: nothing to do
    blocker.unlink()
    blocker.mkdir()
    log.record(PEER, "GET", "/version", status=200)
    log.close()
    assert [e["path"] for e in entries(blocker / "audit.log")] == ["/version"]


def test_metrics_that_cannot_be_written_do_not_stop_the_gate(tmp_path: Path) -> None:
    blocker = tmp_path / "metrics"
    blocker.write_text("not a directory")
    log = Audit(tmp_path / "audit.log", "id-1", "alpha", blocker / "gate.prom")
    log.write_metrics(1, 1, 0)
    assert not (blocker / "gate.prom").exists()


def test_an_entry_without_a_readable_time_sorts_first() -> None:
    assert read.entry_time({}) == 0.0
    assert read.entry_time({"time": "yesterday"}) == 0.0


def test_following_reads_the_rotated_files_then_waits_for_the_log_and_follows_it_across_a_rotation(
    tmp_path: Path,
) -> None:
    path = tmp_path / "audit.log"
    (tmp_path / "audit.log.1").write_text(json.dumps({"time": "2026-01-01T00:00:00+00:00", "n": 0}) + "\n")
    seen: list[object] = []
    stop = threading.Event()

    def follow() -> None:
        for entry in read.follow_entries(path, poll=0.01, stop=stop.is_set):
            seen.append(entry["n"])

    reader = threading.Thread(target=follow)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while seen != [0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05)  # the log does not exist yet: the reader waits for it
        path.write_text(json.dumps({"time": "2026-01-01T00:00:01+00:00", "n": 1}) + "\n")
        while seen != [0, 1]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        path.unlink()  # rotated away; a new file follows
        time.sleep(0.05)
        path.write_text(json.dumps({"time": "2026-01-01T00:00:02+00:00", "n": 2}) + "\n")
        while seen != [0, 1, 2]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        stop.set()
        reader.join(10)
