"""The fleet's remaining failures, provoked for real: a machine whose disk is full, and one that
accepts the connection but never answers (a hung host). Each ends in a clear error, on time, with
nothing half-written on the machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ssh_kit import Fleet, install_agent

from rediacc_core.errors import EXIT_GENERAL, EXIT_TOOL
from rediacc_core.remote.ssh import CONNECT_TIMEOUT


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture
def small_root(tmp_path: Path) -> Iterator[Path]:
    """A machine root on its own 1 MiB tmpfs, so it can really fill up."""
    root = tmp_path / "small"
    root.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def test_a_full_disk_on_the_machine_is_a_clear_error_and_loses_nothing(
    fleet: Fleet, small_root: Path
) -> None:
    install_agent(small_root)
    client = fleet.client
    args = ["machine", "add", "small", "--ssh", fleet.sshd.address, "--root", str(small_root)]
    ok(client.rdc(*args, "--identity", str(fleet.keys["m1"]), "--accept-host-key"))
    ok(client.rdc("repo", "create", "first@small"))
    repos = small_root / "etc/rediacc/repos.json"
    before = repos.read_bytes()
    # Fill the machine's disk to the last byte.
    try:
        with open(small_root / "filler", "wb") as filler:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
    except OSError:
        pass  # ENOSPC: the disk is full
    refused = client.rdc("repo", "create", "second@small")
    assert refused.returncode == EXIT_GENERAL, refused.stderr
    assert "no space left on the device" in refused.stderr and "What to do: free some space" in refused.stderr
    assert repos.read_bytes() == before  # the recorded repos are whole, and only those
    assert [r["name"] for r in json.loads(before)["repos"]] == ["first"]
    (small_root / "filler").unlink()
    ok(client.rdc("repo", "create", "second@small"))


@pytest.fixture
def silent_host() -> Iterator[str]:
    """A host that accepts TCP connections and then says nothing, as a hung machine does."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_a_host_that_never_answers_times_out_with_a_clear_error(
    fleet: Fleet, silent_host: str, tmp_path: Path
) -> None:
    client = fleet.new_client(tmp_path)
    added = ok(client.rdc("machine", "add", "hung", "--ssh", silent_host, "--root", "/", "--accept-host-key"))
    assert (
        "timed out" in added.stdout + added.stderr and "rdc machine trust hung" in added.stdout + added.stderr
    )
    started = time.monotonic()
    result = client.rdc("machine", "trust", "hung")
    took = time.monotonic() - started
    assert result.returncode == EXIT_TOOL, result.stderr
    assert "hung" in result.stderr and "What to do: " in result.stderr
    assert took < CONNECT_TIMEOUT * 3  # bounded by the connect timeout, not hanging


def test_a_trusted_machine_that_hangs_times_out_with_a_clear_error(fleet: Fleet, tmp_path: Path) -> None:
    """sshd stopped (SIGSTOP), not gone: connections are accepted by the kernel and never answered."""
    client = fleet.new_client(tmp_path)
    ok(fleet.add(client, "m1", "--accept-host-key"))
    assert fleet.sshd.process is not None
    listener = fleet.sshd.process.pid
    os.kill(listener, signal.SIGSTOP)
    try:
        started = time.monotonic()
        result = client.rdc("repo", "list", "m1")
        took = time.monotonic() - started
    finally:
        os.kill(listener, signal.SIGCONT)
    assert result.returncode == EXIT_TOOL, result.stderr
    assert "cannot reach machine m1" in result.stderr and "What to do: " in result.stderr
    assert took < CONNECT_TIMEOUT * 3  # bounded by the connect timeout, not hanging
