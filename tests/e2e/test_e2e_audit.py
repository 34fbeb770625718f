"""`rdc repo gate log` shows the real decisions of real docker runs, with the client's pid and uid."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from e2e_kit import E2E, GPU0, GPU1, IMAGE, post, raw_exchange

from rediacc_core.runtime import lifecycle


def gate_log(e2e: E2E, *args: str) -> list[dict[str, Any]]:
    result = e2e.rdc("repo", "gate", "log", e2e.alpha.repo.ref, "-o", "json", *args)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def wait_for(e2e: E2E, since: str, count: int) -> list[dict[str, Any]]:
    """The decisions since `since`, once there are `count` (the gate writes them within a second)."""
    deadline = time.monotonic() + 10
    while True:
        found = [e for e in gate_log(e2e, "--since", since) if e["endpoint"] == "container-create"]
        if len(found) >= count or time.monotonic() > deadline:
            return found


def test_gate_log_shows_admitted_and_refused_docker_runs_with_the_client(e2e: E2E) -> None:
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    e2e.grant(e2e.alpha, GPU0)
    try:
        assert e2e.alpha.docker("run", "--rm", "--device", GPU0, IMAGE, "true").returncode == 0
    finally:
        e2e.revoke(e2e.alpha, GPU0)
    refused = e2e.alpha.docker("run", "--rm", "--device", GPU1, IMAGE, "true")
    assert refused.returncode != 0
    body = json.dumps({"Image": IMAGE, "HostConfig": {"Privileged": True}}).encode()
    status, _ = raw_exchange(e2e.alpha.gate, post("/v1.45/containers/create", body))  # from this process
    assert status in (400, 403)
    admitted, no_grant, privileged = wait_for(e2e, since, 3)[-3:]
    assert (admitted["decision"], admitted["cdi_asked"], admitted["cdi_admitted"]) == (
        "admitted",
        [GPU0],
        [GPU0],
    )
    assert (no_grant["decision"], no_grant["status"], no_grant["rules"]) == ("refused", 403, ["grant"])
    assert (no_grant["cdi_asked"], no_grant["cdi_admitted"]) == ([GPU1], [])
    assert privileged["decision"] == "refused" and privileged["rules"]
    assert privileged["peer"] == {"pid": os.getpid(), "uid": os.getuid(), "gid": os.getgid()}
    for entry in (admitted, no_grant):  # the docker CLI, gone by now: a real process id, root's uid
        assert entry["peer"]["pid"] > 0 and entry["peer"]["pid"] != os.getpid()
        assert entry["peer"]["uid"] == os.getuid()
    assert entry["repo"] == {"id": e2e.alpha.repo.id, "name": e2e.alpha.repo.name}
    table = e2e.rdc("repo", "gate", "log", e2e.alpha.repo.ref, "--since", since)
    assert f"pid {os.getpid()} uid {os.getuid()}" in table.stdout


def test_the_gate_writes_its_counters_for_node_exporter(e2e: E2E) -> None:
    metrics = lifecycle.metrics_file(e2e.machine, e2e.alpha.repo)
    deadline = time.monotonic() + 30
    while not metrics.exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    text = metrics.read_text()
    assert f'repo_id="{e2e.alpha.repo.id}"' in text
    assert "rediacc_gate_open_connections" in text and "rediacc_gate_decision_seconds_bucket" in text
