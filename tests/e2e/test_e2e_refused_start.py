"""A start the gate refuses never leaves the docker CLI waiting: a create it knows it would refuse the
start of (a GPU held back for its health, an ended lease) is refused at create, and a refused start
of a `--rm` container removes it, as the daemon does when its own start fails. `docker run --rm` and
`docker run -d --rm` return within seconds with the rule's message and leave no container behind."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from e2e_kit import CARD, E2E, GPU0, IMAGE, XID, placed_gpu0, refused, wait_for

from rediacc_core.health import clear, record_events
from rediacc_core.model import HealthEvent

QUICK = 5.0  # seconds: a refusal is an answer, not a wait


@pytest.fixture
def granted(e2e: E2E) -> Iterator[None]:
    """GPU0 placed on a card (as setup records it) and granted to alpha; all undone after."""
    with placed_gpu0(e2e.machine):
        e2e.grant(e2e.alpha, GPU0)
        try:
            yield
        finally:
            clear(e2e.machine)
            e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0)


def fault(e2e: E2E) -> None:
    """A new fatal event on CARD (a new log line: one read again after a clear stays cleared)."""
    line = f"[{time.monotonic_ns()}.0] " + XID.split("] ", 1)[1]
    record_events(e2e.machine, [HealthEvent(pci_bus_id=CARD, reason="xid-79", message=XID[15:], key=line)])


def run_quickly(e2e: E2E, *args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = e2e.alpha.docker("run", *args, "--device", GPU0, IMAGE, "true", timeout=60)
    took = time.monotonic() - started
    assert took < QUICK, f"docker run {' '.join(args)} took {took:.1f}s: {result.stderr}"
    return result


def leftovers(e2e: E2E, before: set[str]) -> list[str]:
    return sorted(e2e.alpha.container_ids() - before)


@pytest.mark.parametrize("mode", [("--rm",), ("-d", "--rm")], ids=["rm", "detached-rm"])
def test_an_unhealthy_gpu_is_refused_at_create(e2e: E2E, granted: None, mode: tuple[str, ...]) -> None:
    fault(e2e)
    before = e2e.alpha.container_ids()
    result = run_quickly(e2e, *mode)
    refused(result, f"{GPU0} reaches the GPU at {CARD}", "xid-79", "rdc machine gpu clear m1")
    assert leftovers(e2e, before) == []


@pytest.mark.parametrize("mode", [("--rm",), ("-d", "--rm")], ids=["rm", "detached-rm"])
def test_an_ended_lease_is_refused_at_create(e2e: E2E, mode: tuple[str, ...]) -> None:
    leased = e2e.rdc("repo", "gpu", "grant", e2e.alpha.repo.ref, "--device", GPU0, "--for", "1s")
    assert leased.returncode == 0, leased.stderr
    try:
        time.sleep(1.5)
        before = e2e.alpha.container_ids()
        result = run_quickly(e2e, *mode)
        refused(result, f"the lease of {GPU0} to repo alpha ended at")
        assert leftovers(e2e, before) == []
    finally:
        e2e.rdc("repo", "gpu", "revoke", e2e.alpha.repo.ref, "--device", GPU0)


@pytest.mark.parametrize("why", ["revoked", "unhealthy"])
def test_a_refused_start_removes_a_rm_container(e2e: E2E, granted: None, why: str) -> None:
    """Created while allowed, refused at its start: gone, as the daemon's own failed start leaves it."""
    name = f"made-with-rm-{os.getpid()}-{why}"
    created = e2e.alpha.docker("create", "--rm", "--name", name, "--device", GPU0, IMAGE, "true")
    assert created.returncode == 0, created.stderr
    if why == "revoked":
        e2e.revoke(e2e.alpha, GPU0)
    else:
        fault(e2e)
    started = time.monotonic()
    result = e2e.alpha.docker("start", "-a", name, timeout=60)
    assert time.monotonic() - started < QUICK, result.stderr
    refused(result, f"container {name} was made with --rm, so the gate removed it")
    assert wait_for(lambda: name not in e2e.alpha.docker("ps", "-a", "--format", "{{.Names}}").stdout, 5)
