"""Everything that is not about hardware passes through the gate untouched: attach and exec with
stdin EOF, logs, big archives both ways, a classic build, long chunked responses, BuildKit's
session and its gRPC API."""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_kit import E2E, IMAGE, buildkit_call, h2c_upgrade, raw_exchange

from rediacc_core.gate import buildkit


@pytest.fixture
def sleeper(e2e: E2E) -> Iterator[str]:
    name = "sleeper"
    started = e2e.alpha.docker("run", "-d", "--name", name, IMAGE, "sleep", "600")
    assert started.returncode == 0, started.stderr
    yield name
    e2e.alpha.docker("rm", "-f", name)


def test_run_interactive_sees_stdin_end_and_returns_the_output(e2e: E2E) -> None:
    result = e2e.alpha.docker("run", "-i", "--rm", IMAGE, "cat", input="line one\nline two\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "line one\nline two\n"


def test_exec_interactive_sees_stdin_end(e2e: E2E, sleeper: str) -> None:
    result = e2e.alpha.docker("exec", "-i", sleeper, "sh", "-c", "wc -c; echo done", input="12345")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["5", "done"]


def test_exec_exit_codes_come_back(e2e: E2E, sleeper: str) -> None:
    assert e2e.alpha.docker("exec", sleeper, "sh", "-c", "exit 3").returncode == 3


def test_logs_of_both_streams(e2e: E2E) -> None:
    run = e2e.alpha.docker("run", "--name", "talker", IMAGE, "sh", "-c", "echo to-out; echo to-err >&2")
    try:
        assert run.returncode == 0, run.stderr
        logs = e2e.alpha.docker("logs", "talker")
        assert logs.stdout == "to-out\n" and logs.stderr == "to-err\n"
    finally:
        e2e.alpha.docker("rm", "-f", "talker")


def test_follow_logs_stream_until_the_container_ends(e2e: E2E) -> None:
    script = "for i in 1 2 3 4 5; do echo tick $i; sleep 0.2; done"
    started = e2e.alpha.docker("run", "-d", "--name", "ticker", IMAGE, "sh", "-c", script)
    try:
        assert started.returncode == 0, started.stderr
        followed = e2e.alpha.docker("logs", "-f", "ticker", timeout=30)
        assert followed.stdout.splitlines() == [f"tick {i}" for i in range(1, 6)]
    finally:
        e2e.alpha.docker("rm", "-f", "ticker")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def test_a_big_docker_cp_round_trip_is_intact(e2e: E2E, sleeper: str, tmp_short: Path) -> None:
    original = tmp_short / "big.bin"
    original.write_bytes(os.urandom(24 * 1024 * 1024))
    expected = _sha256(original)
    put = e2e.alpha.docker("cp", str(original), f"{sleeper}:/tmp/big.bin")
    assert put.returncode == 0, put.stderr
    inside = e2e.alpha.docker("exec", sleeper, "sha256sum", "/tmp/big.bin")
    assert inside.stdout.split()[0] == expected
    back = tmp_short / "back.bin"
    got = e2e.alpha.docker("cp", f"{sleeper}:/tmp/big.bin", str(back))
    assert got.returncode == 0, got.stderr
    assert _sha256(back) == expected


def test_a_classic_build(e2e: E2E, tmp_short: Path) -> None:
    context = tmp_short / "ctx"
    context.mkdir()
    (context / "greeting").write_text("built through the gate\n")
    (context / "Dockerfile").write_text(
        f"FROM {IMAGE}\nCOPY greeting /greeting\nRUN cat /greeting\nCMD cat /greeting\n"
    )
    build = e2e.alpha.docker("build", "-t", "built:1", str(context), extra_env={"DOCKER_BUILDKIT": "0"})
    assert build.returncode == 0, build.stderr
    try:
        assert e2e.alpha.docker("run", "--rm", "built:1").stdout == "built through the gate\n"
    finally:
        e2e.alpha.docker("rmi", "-f", "built:1")


def test_stats_and_events_stream(e2e: E2E, sleeper: str) -> None:
    stats = e2e.alpha.docker("stats", "--no-stream", "--format", "{{.Name}}", sleeper)
    assert stats.stdout.strip() == sleeper
    until = f"{time.time() + 1.5:.3f}"  # a live stream that the daemon ends at that moment
    events = e2e.alpha.docker("events", "--since", "0", "--until", until, "--filter", f"container={sleeper}")
    assert "start" in events.stdout


def test_one_connection_carries_many_requests(e2e: E2E) -> None:
    conn = http.client.HTTPConnection("docker", timeout=30)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(e2e.alpha.gate))
    conn.sock = sock
    try:
        for path in ("/_ping", "/v1.45/containers/json", "/v1.45/images/json", "/_ping"):
            conn.request("GET", path)
            response = conn.getresponse()
            assert response.status == 200
            response.read()
        conn.request("HEAD", "/_ping")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b""
        conn.request("GET", "/_ping")
        assert conn.getresponse().read() == b"OK"
    finally:
        conn.close()


def test_buildkits_session_upgrade_passes_through(e2e: E2E) -> None:
    status, _ = raw_exchange(e2e.alpha.gate, h2c_upgrade("/session"), timeout=10)
    assert status == 101


def test_buildkits_grpc_api_is_relayed_call_by_call(e2e: E2E) -> None:
    """buildx's /grpc connection: the gate ends it, relays each call to the daemon and back (a
    call that carries no build steps passes as it is), and answers a call it does not know itself."""
    status, message = buildkit_call(e2e.alpha.gate, buildkit.CONTROL + "ListWorkers", b"")
    assert status == 0, message
    status, message = buildkit_call(e2e.alpha.gate, "/moby.buildkit.v1.Control/Unheard", b"")
    assert status == 7 and "not a BuildKit call the gate knows" in message, message
