"""GPU health on the real Docker Engine: a card its driver reported a fatal event for is held back
at the next start, through the gate (docker start) and below it (the daemon asked directly, where
the runtime guard refuses), until `rdc machine gpu clear`, run as the refusal prints it."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterator

import pytest
from e2e_kit import CARD, E2E, GPU0, IMAGE, XID, placed_gpu0, refused

from rediacc_core.health import clear, record_events
from rediacc_core.model import HealthEvent


@pytest.fixture
def placed(e2e: E2E) -> Iterator[None]:
    """An inventory placing GPU0 on a card, as setup would record it."""
    with placed_gpu0(e2e.machine):
        yield
        clear(e2e.machine)


@pytest.fixture
def trainer(e2e: E2E, placed: None) -> Iterator[str]:
    e2e.grant(e2e.alpha, GPU0)
    name = f"trainer-{os.getpid()}-{time.monotonic_ns()}"
    created = e2e.alpha.docker("create", "--name", name, "--device", GPU0, IMAGE, "true")
    assert created.returncode == 0, created.stderr
    yield name
    e2e.alpha.docker("rm", "-f", name)
    e2e.revoke(e2e.alpha, GPU0)


def test_an_unhealthy_gpu_is_held_back_until_cleared(e2e: E2E, trainer: str) -> None:
    assert e2e.alpha.docker("start", "-a", trainer).returncode == 0, "healthy: it runs"
    record_events(e2e.machine, [HealthEvent(pci_bus_id=CARD, reason="xid-79", message=XID[15:], key=XID)])

    refusal = e2e.alpha.docker("start", "-a", trainer)
    refused(refusal, f"holds {GPU0}, which reaches the GPU at {CARD}", "xid-79", "rdc machine gpu clear")
    status, body = e2e.alpha.daemon_api("POST", f"/containers/{trainer}/start")  # below the gate
    assert status >= 400 and "a device of a GPU its driver reported unhealthy" in body["message"]

    # The clear command as the refusal printed it.
    command = refusal.stderr.split("an operator's `", 1)[1].split("`", 1)[0]
    assert command == f"rdc machine gpu clear m1 --device {GPU0}"
    cleared = e2e.rdc(*shlex.split(command)[1:])
    assert cleared.returncode == 0, cleared.stderr
    assert f"Cleared the GPU at {CARD} (xid-79)" in cleared.stderr
    started = e2e.alpha.docker("start", "-a", trainer)
    assert started.returncode == 0, started.stderr
