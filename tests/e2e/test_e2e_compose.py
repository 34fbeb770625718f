"""Docker Compose through the gate: the seed's `devices: [vendor/class=name]` works when granted
(Compose before 2.30 sends it as a legacy device path, which the gate rewrites into the CDI
request); `runtime:`, `deploy.resources.reservations.devices` and `gpus:` are refused."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from e2e_kit import E2E, GPU0, IMAGE


def compose_file(directory: Path, service: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "compose.yaml").write_text(
        f"services:\n  job:\n    image: {IMAGE}\n    pull_policy: never\n    network_mode: none\n" + service
    )
    return directory


def run_job(e2e: E2E, directory: Path) -> subprocess.CompletedProcess[str]:
    try:
        return e2e.alpha.compose(directory, "run", "--rm", "job")
    finally:
        e2e.alpha.compose(directory, "down", "--remove-orphans")


def test_compose_devices_with_a_granted_cdi_name_reach_the_container(e2e: E2E, tmp_short: Path) -> None:
    project = compose_file(
        tmp_short / "granted",
        f"    command: ls -l /dev/fakegpu0\n    devices:\n      - {GPU0}\n",
    )
    e2e.grant(e2e.alpha, GPU0)
    try:
        result = run_job(e2e, project)
    finally:
        e2e.revoke(e2e.alpha, GPU0)
    assert result.returncode == 0, result.stderr
    assert "1,   7" in result.stdout  # FAKEGPU0


def test_compose_devices_without_the_grant_are_refused(e2e: E2E, tmp_short: Path) -> None:
    project = compose_file(tmp_short / "ungranted", f"    command: 'true'\n    devices:\n      - {GPU0}\n")
    result = run_job(e2e, project)
    assert result.returncode != 0
    assert f"no grant for {GPU0}" in result.stderr


@pytest.mark.parametrize(
    ("service", "needle"),
    [
        ("    command: 'true'\n    runtime: nvidia\n", "runtime"),
        (
            "    command: 'true'\n"
            "    deploy:\n      resources:\n        reservations:\n          devices:\n"
            "            - driver: nvidia\n              count: all\n              capabilities: [gpu]\n",
            "devices:",
        ),
        (
            "    command: 'true'\n"
            "    deploy:\n      resources:\n        reservations:\n          devices:\n"
            "            - capabilities: [gpu]\n              device_ids: ['0']\n",
            "devices:",
        ),
        ("    command: 'true'\n    privileged: true\n", "rivileged"),
        ("    command: 'true'\n    devices:\n      - /dev/fakegpu0\n", "/dev/fakegpu0"),
        ("    command: 'true'\n    volumes:\n      - /dev:/dev\n", "/dev"),
        ("    command: 'true'\n    device_cgroup_rules:\n      - 'c 1:3 rwm'\n", "cgroup"),
    ],
    ids=[
        "runtime",
        "reservations-driver",
        "reservations-capabilities",
        "privileged",
        "raw-device",
        "dev-bind",
        "cgroup-rule",
    ],
)
def test_other_compose_routes_to_hardware_are_refused(
    e2e: E2E, tmp_short: Path, service: str, needle: str
) -> None:
    e2e.grant(e2e.alpha, GPU0)
    try:
        result = run_job(e2e, compose_file(tmp_short / "refused", service))
    finally:
        e2e.revoke(e2e.alpha, GPU0)
    assert result.returncode != 0, result.stdout
    assert needle in result.stderr, result.stderr
    assert e2e.alpha.hardware_containers() == []


def test_compose_gpus_key_never_reaches_hardware(e2e: E2E, tmp_short: Path) -> None:
    # Compose before 2.30 drops `gpus:` without a word; newer ones send a device request that the
    # gate refuses. Either way the container must come out without hardware.
    project = compose_file(tmp_short / "gpus", "    command: 'true'\n    gpus: all\n")
    try:
        created = e2e.alpha.compose(project, "up", "--no-start")
        if created.returncode != 0:
            assert "--device" in created.stderr, created.stderr
        assert e2e.alpha.hardware_containers() == []
    finally:
        e2e.alpha.compose(project, "down", "--remove-orphans")
