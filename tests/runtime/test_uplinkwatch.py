"""The uplink rules follow the host: written at the watcher's start, again at each change of the
host's destinations, and again from a whole read after any failure."""

from __future__ import annotations

import errno
import socket
import struct
import subprocess
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from rediacc_core.runtime import layout, netns, ports, rtnetlink, uplinkwatch

NET = layout.RepoNetwork("rdc-0123456789ab", Path("/run/rediacc/0123456789ab/net"))


class Stop(BaseException):
    """Ends `follow`, which no Exception does."""


def test_the_log_says_what_is_refused_first_and_then_what_changed() -> None:
    assert (
        uplinkwatch.changes(None, ["0.0.0.0/8", "192.0.2.2/32"])
        == "uplink rules: refusing 0.0.0.0/8, 192.0.2.2/32"
    )
    line = uplinkwatch.changes(["192.0.2.2/32", "198.18.4.1/32"], ["192.0.2.2/32", "198.18.5.1/32"])
    assert (
        line
        == "uplink rules: now refusing 198.18.5.1/32; no longer refusing 198.18.4.1/32 (gone from the host)"
    )


def _follow(
    monkeypatch: pytest.MonkeyPatch, reads: list[list[str]], failing: Collection[int] = ()
) -> tuple[list[Any], list[str]]:
    """Run `follow` over successive host reads (one per change); what it applied and logged."""
    applied: list[Any] = []
    logged: list[str] = []
    subscriptions = []

    def read() -> list[str]:
        if not reads:
            raise Stop
        return reads.pop(0)

    def apply(net: layout.RepoNetwork, blocked: list[str]) -> None:
        applied.append(list(blocked))
        if len(applied) in failing:
            raise OSError("iptables-restore: resource busy")

    def subscribe(groups: int) -> socket.socket:
        subscriptions.append(groups)
        return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    monkeypatch.setattr(netns, "host_destinations", read)
    monkeypatch.setattr(netns, "apply_rules", apply)
    monkeypatch.setattr(rtnetlink, "subscribe", subscribe)
    monkeypatch.setattr(uplinkwatch, "_wait_for_change", lambda events: None)
    monkeypatch.setattr(uplinkwatch, "RETRY", 0.0)
    with pytest.raises(Stop):
        uplinkwatch.follow(NET, logged.append)
    assert subscriptions and all(g == uplinkwatch.GROUPS for g in subscriptions)
    return applied, logged


def test_the_rules_are_written_at_start_and_again_only_when_the_destinations_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, late = (
        ["0.0.0.0/8", "192.0.2.2/32"],
        ["0.0.0.0/8", "192.0.2.2/32", "198.18.5.0/24", "198.18.5.1/32"],
    )
    applied, logged = _follow(monkeypatch, [first, first, late, late])
    assert applied == [first, late]  # at start (closing the gap since `up`), then at the change
    assert logged[-1] == "uplink rules: now refusing 198.18.5.0/24, 198.18.5.1/32"


def test_after_a_failure_it_subscribes_again_and_writes_the_whole_rule_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = ["0.0.0.0/8", "192.0.2.2/32"]
    applied, logged = _follow(monkeypatch, [first, first], failing={1})
    assert applied == [first, first]  # written again though unchanged: the failed write may be partial
    assert "following the host failed: OSError: iptables-restore: resource busy" in logged[0]


def test_a_failure_that_lasts_is_logged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[list[str]] = [["0.0.0.0/8"]] * 5
    applied, logged = _follow(monkeypatch, reads, failing=range(1, 6))
    assert len(applied) == 5 and len(logged) == 1  # every write failed: said once


def _announce(sender: socket.socket, kind: int) -> None:
    body = struct.pack("=BBBBI", socket.AF_INET, 24, 0, 0, 7)
    sender.send(struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body)


def test_a_change_is_awaited_and_what_follows_it_at_once_is_read_with_it() -> None:
    events, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with events, sender:
        _announce(sender, 16)  # RTM_NEWLINK: not a change of addresses or routes
        _announce(sender, rtnetlink.RTM_NEWADDR)
        _announce(sender, rtnetlink.RTM_NEWROUTE)  # the same change's route, a moment later
        waiting = threading.Thread(target=uplinkwatch._wait_for_change, args=(events,))
        waiting.start()
        waiting.join(5)
        assert not waiting.is_alive()
        events.setblocking(False)
        with pytest.raises(BlockingIOError):
            events.recv(1)  # all three were read: the next wait waits for the next change


def test_changes_the_kernel_dropped_count_as_a_change(monkeypatch: pytest.MonkeyPatch) -> None:
    def overrun(sock: socket.socket) -> list[rtnetlink.Message]:
        if sock.gettimeout() is None:
            raise OSError(errno.ENOBUFS, "No buffer space available")
        raise TimeoutError

    monkeypatch.setattr(rtnetlink, "receive", overrun)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as events:
        uplinkwatch._wait_for_change(events)  # returns: the caller reads the whole state again


def test_the_port_keeper_that_bring_up_starts_follows_the_host_for_its_namespace(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`rdc repo up` and the dockerd unit (`rdc repo dockerd`) both start the keeper through
    `bring_up`; the keeper runs the watcher as a thread of its own, so it starts and stops with it."""
    net = layout.RepoNetwork("rdc-0123456789ab", tmp_path)
    started: list[list[str]] = []
    monkeypatch.setattr(netns, "_tool", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(netns, "exists", lambda net: True)
    monkeypatch.setattr(netns, "host_destinations", lambda: ["0.0.0.0/8"])
    monkeypatch.setattr(netns, "apply_rules", lambda net, blocked: None)
    monkeypatch.setattr(netns, "uplink_pid", lambda net: 1)
    monkeypatch.setattr(netns, "ports_pid", lambda net: None)

    def popen(argv: list[str], **kwargs: Any) -> _Started:
        started.append(argv)
        return _Started()

    monkeypatch.setattr(subprocess, "Popen", popen)
    netns.bring_up(net, Path("/"), tmp_path / "docker.sock")
    (argv,) = started
    assert argv[argv.index("--netns") + 1] == net.name

    watched: list[layout.RepoNetwork] = []
    monkeypatch.setattr(uplinkwatch, "start", lambda net, log: watched.append(net))
    monkeypatch.setattr(ports, "follow", lambda root, daemon, api, state: None)
    assert ports.main(argv[argv.index("-m") + 2 :]) == 0
    assert [(w.name, w.path) for w in watched] == [(net.name, net.path)]


class _Started:
    pid = 4242
