"""A descriptor in flight is held by nobody a scan can see: on the real Docker Engine, container X
of alpha (granted GPU0) opens the node and hands the descriptor over a shared volume to container Y,
which names no device. Y sends it into a socketpair of its own and closes its copy: no fd table and
no memory map holds the file, it lives in the socket's queue (the control: no process of alpha is
found holding the node, and Y still reads the device once it takes the descriptor back).

Handing the hardware to beta exclusively must not depend on seeing it: a take-over, a revoke with
--stop, an exclusive grant after a revoke without it, and a lease's end under lease-end=stop each
empty alpha (every running container of it stopped while none may start), so Y is dead and the
descriptor with it. Checked by effect: Y no longer runs and never reads the device. And the race:
holders alpha starts every 2 s during a take-over never run after it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_kit import E2E, GPU0, IMAGE, RepoEnv, wait_for
from holding_kit import build_fdpass, holding, running, start_with_helper

from rediacc_core.runtime.holdings import device_openers

SEND = "exec 3</dev/fakegpu0; until [ -S /s/sock ]; do sleep 0.1; done; /fdpass send /s/sock 3; sleep 300"


@pytest.fixture(scope="module")
def fdpass(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fdpass(tmp_path_factory)


@dataclass
class InFlight:
    keeper: str  # Y: names no device; the descriptor is in its socketpair's queue
    volume: str
    holder: str  # X: opened the node and sent it, then stopped by the tenant


@pytest.fixture
def in_flight(e2e: E2E, fdpass: Path) -> Iterator[InFlight]:
    env, tag = e2e.alpha, f"{os.getpid()}-{time.monotonic_ns() % 10**6}"
    found = InFlight(f"fy-{tag}", f"ffds-{tag}", f"fx-{tag}")
    assert env.docker("volume", "create", found.volume).returncode == 0
    try:
        yield found
    finally:
        env.docker("rm", "-f", found.holder, found.keeper)
        env.docker("volume", "rm", found.volume)
        for repo in (e2e.alpha, e2e.beta):
            e2e.rdc("repo", "gpu", "revoke", repo.repo.ref, "--device", GPU0)
        e2e.rdc("machine", "config", "m1", "--unset", "lease-end")


def put_in_flight(e2e: E2E, fdpass: Path, found: InFlight) -> None:
    """X (granted GPU0) sends its descriptor to Y, Y puts it in flight, the tenant stops X."""
    env = e2e.alpha
    mount = ("-v", f"{found.volume}:/s")
    start_with_helper(env, fdpass, found.keeper, *mount, IMAGE, "/fdpass", "inflight", "/s/sock", "/s/go")
    start_with_helper(env, fdpass, found.holder, "--device", GPU0, *mount, IMAGE, "sh", "-c", SEND)
    assert wait_for(lambda: "in flight" in env.docker("logs", found.keeper).stdout)
    assert env.docker("rm", "-f", found.holder).returncode == 0
    # The control: nothing of alpha is seen holding the node, by the test's own reading or rdc's.
    assert holding(env) == {} and device_openers(e2e.machine, env.repo, [("c", 1, 7)]) == []
    assert running(env, found.keeper)


def take_it_back(e2e: E2E, found: InFlight) -> str:
    """Tell Y to take the descriptor back and read the device; what Y said (its logs)."""
    touched = e2e.alpha.docker("run", "--rm", "-v", f"{found.volume}:/s", IMAGE, "touch", "/s/go")
    assert touched.returncode == 0, touched.stderr
    # Y looks for the trigger ten times a second and then says what it got; a Y that is gone says
    # nothing more, so its logs are read once it had the time to.
    deadline = time.monotonic() + 15
    while True:
        said = e2e.alpha.docker("logs", found.keeper).stdout
        answered = "read 1 byte" in said or "did not come back" in said
        if answered or time.monotonic() > deadline or not running(e2e.alpha, found.keeper):
            return said
        time.sleep(0.2)


def dead(e2e: E2E, found: InFlight) -> None:
    assert not running(e2e.alpha, found.keeper)
    assert "read 1 byte" not in take_it_back(e2e, found)


def test_the_control_a_descriptor_in_flight_is_seen_by_no_scan_and_still_reads_the_device(
    e2e: E2E,
    fdpass: Path,
    in_flight: InFlight,
) -> None:
    e2e.grant(e2e.alpha, GPU0)
    put_in_flight(e2e, fdpass, in_flight)
    assert "read 1 byte from the device" in take_it_back(e2e, in_flight)


def test_take_over_empties_the_old_repo_so_the_descriptor_in_flight_dies(
    e2e: E2E,
    fdpass: Path,
    in_flight: InFlight,
) -> None:
    e2e.grant(e2e.alpha, GPU0)
    put_in_flight(e2e, fdpass, in_flight)
    beta = e2e.beta.repo.ref
    moved = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive", "--take-over", "--yes")
    assert moved.returncode == 0, moved.stderr
    assert f"revokes: {GPU0} of repo alpha@m1" in moved.stderr
    assert f"Stopped container {in_flight.keeper} of repo alpha@m1" in moved.stderr
    dead(e2e, in_flight)


def test_take_over_without_yes_off_a_terminal_lists_and_revokes_nothing(
    e2e: E2E, in_flight: InFlight
) -> None:
    e2e.grant(e2e.alpha, GPU0)
    beta = e2e.beta.repo.ref
    asked = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive", "--take-over")
    assert asked.returncode == 4, asked.stderr
    assert f"not revoking {GPU0} of repo alpha@m1 without confirmation" in asked.stderr
    assert GPU0 in e2e.rdc("repo", "gpu", "list", e2e.alpha.repo.ref).stdout


def test_an_exclusive_grant_after_a_revoke_without_stop_waits_until_the_old_repo_runs_nothing(
    e2e: E2E,
    fdpass: Path,
    in_flight: InFlight,
) -> None:
    e2e.grant(e2e.alpha, GPU0)
    put_in_flight(e2e, fdpass, in_flight)
    revoked = e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0)
    assert revoked.returncode == 0, revoked.stderr  # nothing visible holds it: no scan sees Y's
    beta = e2e.beta.repo.ref
    blocked = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive")
    assert blocked.returncode == 4, blocked.stderr
    assert "repo alpha@m1 held" in blocked.stderr and f"container {in_flight.keeper}" in blocked.stderr
    assert "--stop-holders" in blocked.stderr and "rdc repo down alpha@m1" in blocked.stderr
    assert running(e2e.alpha, in_flight.keeper)
    moved = e2e.rdc("repo", "gpu", "grant", beta, "--device", GPU0, "--exclusive", "--stop-holders")
    assert moved.returncode == 0, moved.stderr
    dead(e2e, in_flight)


def test_revoke_stop_empties_the_repo_then_an_exclusive_grant_elsewhere_is_safe(
    e2e: E2E,
    fdpass: Path,
    in_flight: InFlight,
) -> None:
    e2e.grant(e2e.alpha, GPU0)
    put_in_flight(e2e, fdpass, in_flight)
    done = e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0, "--stop")
    assert done.returncode == 0, done.stderr
    assert f"Stopped container {in_flight.keeper}" in done.stderr and "Emptied alpha@m1" in done.stderr
    granted = e2e.rdc("repo", "gpu", "grant", e2e.beta.repo.ref, "--device", GPU0, "--exclusive")
    assert granted.returncode == 0, granted.stderr
    dead(e2e, in_flight)


def test_a_lease_end_with_stop_empties_the_repo(
    e2e: E2E,
    fdpass: Path,
    in_flight: InFlight,
) -> None:
    assert e2e.rdc("machine", "config", "m1", "--set", "lease-end=stop").returncode == 0
    leased = e2e.rdc("repo", "gpu", "grant", e2e.alpha.repo.ref, "--device", GPU0, "--for", "20s")
    assert leased.returncode == 0, leased.stderr
    put_in_flight(e2e, fdpass, in_flight)
    # At most 30 s after the end (the gate's housekeeping round), Y is stopped: no scan saw it.
    assert wait_for(lambda: not running(e2e.alpha, in_flight.keeper), timeout=90)
    said = f"lease-end: stopped container {in_flight.keeper}"
    assert wait_for(lambda: said in e2e.alpha.runtime.gate_log.read_text())
    dead(e2e, in_flight)


def test_holders_started_during_a_take_over_never_run_after_it(e2e: E2E, in_flight: InFlight) -> None:
    """The old repo's first holder ignores SIGTERM (its stop takes 10 s); meanwhile the tenant starts
    a new holder every 2 s. The drain mark and the revocation are written before any stop."""
    env, tag = e2e.alpha, in_flight.volume
    e2e.grant(env, GPU0)
    first = env.docker("run", "-d", "--name", f"{tag}-h0", "--device", GPU0, IMAGE, "sleep", "300")
    assert first.returncode == 0, first.stderr
    done = threading.Event()
    names: list[str] = []

    def keep_starting() -> None:
        while not done.is_set():
            name = f"{tag}-h{len(names) + 1}"
            names.append(name)
            env.docker("run", "-d", "--name", name, "--device", GPU0, IMAGE, "sleep", "300")
            done.wait(2)

    starter = threading.Thread(target=keep_starting)
    starter.start()
    try:
        time.sleep(3)
        moved = e2e.rdc(
            "repo", "gpu", "grant", e2e.beta.repo.ref, "--device", GPU0, "--exclusive", "--take-over", "--yes"
        )
        done.set()
        starter.join()
        assert moved.returncode == 0, moved.stderr
        assert len(names) >= 3, names  # the take-over took its time: the first holder's 10 s stop
        for _ in range(2):  # right after it, and once a restart could have happened
            late = [n for n in [f"{tag}-h0", *names] if _exists(env, n) and running(env, n)]
            assert late == [], f"started during the take-over and running after it: {late}"
            time.sleep(3)
        assert holding(env) == {}
    finally:
        done.set()
        starter.join()
        env.docker("rm", "-f", f"{tag}-h0", *names)


def _exists(env: RepoEnv, name: str) -> bool:
    status, _ = env.daemon_api("GET", f"/containers/{name}/json")
    return bool(status == 200)
