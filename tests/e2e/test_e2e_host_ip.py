"""Each spelling of a port binding's `HostIp` is held to the publishing policy at the address the
daemon really binds: sent raw through the gate (the docker CLI would tidy them), a spelling the
daemon binds on every address is refused on host port 80 like an empty one, and admitted on a
high port, where the daemon's own record of the container shows the address the gate read."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from e2e_kit import E2E, IMAGE

from rediacc_core.gate.wire.goip import bound_address
from rediacc_core.testing.dockerenv import docker_api

JSON = "application/json"
SPELLINGS = [
    "", "0.0.0.0", "::", "[::1]", "[::]", "[0.0.0.0]", "0.0.0.0 ", " ::", "127.000.000.001", "127.0.0.01",
    "::1%lo", "fe80::1%eth0", "::ffff:0.0.0.0", "0:0:0:0:0:0:0:0", "::0.0.0.0", "localhost",
    "127.0.0.1", "::ffff:127.0.0.1",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _create(e2e: E2E, host_ip: str, host_port: str) -> tuple[int, Any]:
    body = {
        "Image": IMAGE,
        "Cmd": ["httpd", "-f", "-p", "8080"],
        "ExposedPorts": {"8080/tcp": {}},
        "HostConfig": {"PortBindings": {"8080/tcp": [{"HostIp": host_ip, "HostPort": host_port}]}},
    }
    data = json.dumps(body).encode()
    return docker_api(e2e.alpha.gate, "POST", "/containers/create", data, Content_Type=JSON)


def _recorded(e2e: E2E, container: str) -> set[str]:
    """The host addresses the daemon records the container's 8080/tcp as published on."""
    status, inspected = docker_api(e2e.alpha.gate, "GET", f"/containers/{container}/json")
    assert status == 200, inspected
    return {str(b["HostIp"]) for b in inspected["NetworkSettings"]["Ports"].get("8080/tcp") or []}


@pytest.mark.parametrize("host_ip", SPELLINGS)
def test_a_host_ip_is_held_to_the_policy_at_the_address_the_daemon_binds(e2e: E2E, host_ip: str) -> None:
    address = bound_address(host_ip)
    everywhere = address in ("", "0.0.0.0", "::")
    status, answer = _create(e2e, host_ip, "80")
    if everywhere:
        assert status == 403, answer
        assert "host port 80/tcp is refused" in str(answer)
    else:
        assert status == 201, answer  # one address inside the namespace: not the host's business
        docker_api(e2e.alpha.gate, "DELETE", f"/containers/{answer['Id']}?force=1")
    # Admitted on a high port; the daemon's record says where it bound.
    status, answer = _create(e2e, host_ip, str(_free_port()))
    assert status == 201, answer
    container = answer["Id"]
    try:
        status, started = docker_api(e2e.alpha.gate, "POST", f"/containers/{container}/start")
        assert status == 204, started
        recorded = _recorded(e2e, container)
        if address == "":  # the daemon's default: every IPv4 address, and IPv6 where it maps it
            assert recorded in ({"0.0.0.0"}, {"0.0.0.0", "::"}), recorded
        elif ":" in address:  # IPv6: bound as read, or not at all where the container has no IPv6
            assert recorded in ({address}, set()), recorded
        else:
            assert recorded == {address}, recorded
    finally:
        docker_api(e2e.alpha.gate, "DELETE", f"/containers/{container}?force=1")
