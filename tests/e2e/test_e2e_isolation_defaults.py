"""The gate's defaults and fetch rules, proven by their effect on a real Docker Engine.

A container created at an old API version lands in a cgroup namespace of its own; a container that
asks for no PIDs limit gets the machine's, seen in its own cgroup; the daemon fetches nothing from
a service on the host's loopback (a listener that records every connection stays silent), though
the same pull reaches it once the machine allows that registry; git remotes are never cloned.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from e2e_kit import E2E, GPU0, GPU1, IMAGE, post, raw_exchange, refused

from rediacc_core.settings import set_setting, unset_setting

PIDS_MAX = "cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max"


def cgroup_v2() -> bool:
    return Path("/sys/fs/cgroup/cgroup.controllers").exists()


@dataclass
class Listener:
    """A TCP service on the host's loopback that records who connected (standing for kubelet's
    read-only port, an exporter, an admin API)."""

    port: int
    seen: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    found = Listener(server.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            found.seen.append(f"{peer[0]}:{peer[1]}")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield found
    stop.set()
    thread.join(5)
    server.close()


def raw_get(e2e: E2E, target: str) -> tuple[int, bytes]:
    return raw_exchange(e2e.alpha.gate, f"GET {target} HTTP/1.1\r\nHost: docker\r\n\r\n".encode())


def build_remote(e2e: E2E, remote: str) -> tuple[int, bytes]:
    """`/build?remote=`, as the API takes it (the docker CLI fetches URL and git contexts itself)."""
    target = f"/v1.45/build?remote={urllib.parse.quote(remote, safe='')}"
    return raw_exchange(e2e.alpha.gate, post(target, b"", content_type="application/x-tar"))


# --- defaults the gate writes into what it forwards --------------------------------------------


def test_a_v1_40_create_gets_a_cgroup_namespace_of_its_own(e2e: E2E) -> None:
    host_ns = os.readlink("/proc/self/ns/cgroup")  # the daemon's and this test's: the host's
    if not cgroup_v2():
        # Without the gate, dockerd on cgroup v1 puts such a container in the host's namespace.
        body = json.dumps({"Image": IMAGE, "Cmd": ["true"]}).encode()
        status, created = e2e.alpha.daemon_api("POST", "/v1.40/containers/create", body)
        assert status == 201, created
        status, inspected = e2e.alpha.daemon_api("GET", f"/containers/{created['Id']}/json")
        e2e.alpha.daemon_api("DELETE", f"/containers/{created['Id']}?force=1")
        assert inspected["HostConfig"]["CgroupnsMode"] == "host"
    old = {"DOCKER_API_VERSION": "1.40"}
    result = e2e.alpha.docker("run", "--rm", IMAGE, "readlink", "/proc/self/ns/cgroup", extra_env=old)
    assert result.returncode == 0, result.stderr
    inside = result.stdout.strip()
    assert inside.startswith("cgroup:[") and inside != host_ns


def test_a_container_asking_for_no_pids_limit_gets_the_machines(e2e: E2E) -> None:
    for asked in ([], ["--pids-limit", "-1"], ["--pids-limit", "0"]):
        result = e2e.alpha.docker("run", "--rm", *asked, IMAGE, "sh", "-c", PIDS_MAX)
        assert (result.returncode, result.stdout.strip()) == (0, "4096"), (asked, result.stderr)
    result = e2e.alpha.docker("run", "--rm", "--pids-limit", "100", IMAGE, "sh", "-c", PIDS_MAX)
    assert result.stdout.strip() == "100", result.stderr


def test_more_pids_than_the_machine_allows_is_refused(e2e: E2E) -> None:
    before = e2e.alpha.container_ids()
    refused(e2e.alpha.docker("run", "--rm", "--pids-limit", "5000", IMAGE, "true"), "PidsLimit 5000")
    assert e2e.alpha.container_ids() == before


def test_an_update_to_unlimited_pids_gets_the_machines_limit(e2e: E2E) -> None:
    started = e2e.alpha.docker("run", "-d", "--pids-limit", "50", IMAGE, "sleep", "300")
    assert started.returncode == 0, started.stderr
    container = started.stdout.strip()
    try:
        refused(e2e.alpha.docker("update", "--pids-limit", "9999", container), "PidsLimit 9999")
        assert e2e.alpha.docker("update", "--pids-limit", "-1", container).returncode == 0
        result = e2e.alpha.docker("exec", container, "sh", "-c", PIDS_MAX)
        assert result.stdout.strip() == "4096", result.stderr
    finally:
        e2e.alpha.docker("rm", "-f", container)


def test_rlimits_above_the_daemons_own_are_refused(e2e: E2E) -> None:
    before = e2e.alpha.container_ids()
    refused(e2e.alpha.docker("run", "--rm", "--ulimit", "rtprio=99", IMAGE, "true"), "Ulimits rtprio")
    refused(e2e.alpha.docker("run", "--rm", "--ulimit", "memlock=-1", IMAGE, "true"), "Ulimits memlock")
    assert e2e.alpha.container_ids() == before
    result = e2e.alpha.docker("run", "--rm", "--ulimit", "nofile=512:1024", IMAGE, "sh", "-c", "ulimit -n")
    assert result.stdout.strip() == "512", result.stderr


def test_annotations_a_runtime_acts_on_are_refused(e2e: E2E) -> None:
    before = e2e.alpha.container_ids()
    asked = ["--annotation", "org.systemd.property.DevicePolicy=auto"]
    refused(e2e.alpha.docker("run", "--rm", *asked, IMAGE, "true"), "org.systemd.property.DevicePolicy")
    assert e2e.alpha.container_ids() == before
    metadata = ["--annotation", "org.opencontainers.image.source=https://example.org/app"]
    assert e2e.alpha.docker("run", "--rm", *metadata, IMAGE, "true").returncode == 0


# --- no fetch from the host itself ---------------------------------------------------------------


def test_nothing_reaches_a_service_on_the_hosts_loopback(e2e: E2E, listener: Listener) -> None:
    address = listener.address
    alpha = e2e.alpha
    refused(alpha.docker("pull", f"{address}/app"), "fetch from it as the host's root")
    refused(alpha.docker("import", f"http://{address}/rootfs.tar", "imported"), "import fromSrc")
    status, answer = build_remote(e2e, f"http://{address}/context.tar")
    assert status == 403 and b"build remote" in answer, answer
    refused(alpha.docker("search", f"{address}/app"), "search term")
    login = alpha.docker("login", "-u", "u", "--password-stdin", address, input="p\n")
    assert login.returncode != 0 and "login serveraddress" in login.stderr, login.stderr
    assert alpha.docker("tag", IMAGE, f"{address}/app").returncode == 0  # a tag fetches nothing
    try:
        refused(alpha.docker("push", f"{address}/app"), "push of")
    finally:
        alpha.docker("rmi", f"{address}/app")
    raw = (f"/v1.45/distribution/{address}/app/json", f"/v1.45/plugins/privileges?remote={address}/p")
    for target in raw:
        status, answer = raw_get(e2e, target)
        assert status == 403 and b"fetch from it as the host's root" in answer, answer
    status, answer = raw_exchange(alpha.gate, post(f"/v1.45/images/create?fromSrc={address}/x", b""))
    assert status == 403, answer
    assert listener.seen == []


def test_allowed_the_pull_is_forwarded_yet_reaches_only_the_repos_own_loopback(
    e2e: E2E, listener: Listener
) -> None:
    # The control of the gate's rule: allowed, the pull goes to the daemon, which dials the address.
    # The repo's daemon lives in its own network namespace, where 127.0.0.1 is the namespace's own,
    # so the host's listener still hears nothing (`registries` admits a loopback registry for a
    # repo on an existing daemon in the host's namespace).
    set_setting(e2e.machine, "registries", listener.address)
    try:
        pulled = e2e.alpha.docker("pull", f"{listener.address}/app")
    finally:
        unset_setting(e2e.machine, "registries")
    assert pulled.returncode != 0 and f"dial tcp {listener.address}" in pulled.stderr, pulled.stderr
    assert listener.seen == []


@pytest.mark.parametrize(
    "remote",
    [
        # Its .gitmodules may name ssh://git@..., which moby's `git submodule update` would run the
        # host's ssh for, with the host's root keys and no protocol limits.
        "https://example.invalid/org/app.git",
        "https://example.invalid/org/app.git#main:docker",
        "git@example.invalid:org/app.git",
        "git://example.invalid/org/app",
        "github.com/org/app",
    ],
)
def test_git_remotes_are_never_cloned(e2e: E2E, remote: str) -> None:
    status, answer = build_remote(e2e, remote)
    assert status == 403 and b"the daemon would clone it with git as the host's root" in answer, answer


def test_info_lists_only_the_cdi_devices_the_repo_holds(e2e: E2E) -> None:
    """Engine 28+ lists in /info every CDI device of the machine; through the gate a tenant sees its own."""
    status, direct = e2e.alpha.daemon_api("GET", "/info")
    assert status == 200, direct
    if int(direct["ServerVersion"].split(".")[0]) < 28:
        pytest.skip("Engine 26.1's /info lists no CDI devices (DiscoveredDevices is API 1.50+): none to cut")
    e2e.grant(e2e.alpha, GPU0)
    try:
        status, direct = e2e.alpha.daemon_api("GET", "/info")
        assert status == 200, direct
        listed = json.loads(
            raw_exchange(e2e.alpha.gate, b"GET /info HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n")[
                1
            ]
        )
        # The daemon lists the machine's devices, the other repo's and the ungranted ones too.
        assert {GPU0, GPU1} <= {d["ID"] for d in direct["DiscoveredDevices"]}
        assert [d["ID"] for d in listed["DiscoveredDevices"]] == [GPU0]
        assert listed["ID"] == direct["ID"]  # the rest of the answer is the daemon's
    finally:
        e2e.revoke(e2e.alpha, GPU0)


@pytest.mark.parametrize("spelled", ["DriverOpts", "driveropts"])
def test_an_endpoint_sysctl_is_refused_at_create_and_at_connect(e2e: E2E, spelled: str) -> None:
    """Per-interface sysctls ride in an endpoint's driver options (API 1.46+): the sysctl policy holds,
    whatever case the tenant writes the key in (the daemon reads `driveropts` as DriverOpts)."""
    made = e2e.alpha.docker("network", "create", "sysnet")
    assert made.returncode == 0, made.stderr
    try:
        opts = {"com.docker.network.endpoint.sysctls": "net.ipv4.conf.IFNAME.forwarding=1"}
        body = {
            "Image": IMAGE,
            "Cmd": ["true"],
            "NetworkingConfig": {"EndpointsConfig": {"sysnet": {spelled: opts}}},
        }
        # The attack is real: sent straight to the daemon, the spelling reaches the endpoint.
        status, direct = e2e.alpha.daemon_api(
            "POST", "/containers/create?name=sysctl0", json.dumps(body).encode()
        )
        assert status == 201, direct
        _, inspected = e2e.alpha.daemon_api("GET", "/containers/sysctl0/json")
        assert inspected["NetworkSettings"]["Networks"]["sysnet"]["DriverOpts"] == opts
        status, answer = raw_exchange(
            e2e.alpha.gate, post("/containers/create?name=sysctl1", json.dumps(body).encode())
        )
        assert status == 403 and b"net.ipv4.conf.IFNAME.forwarding" in answer, answer
        assert e2e.alpha.daemon_api("GET", "/containers/sysctl1/json")[0] == 404  # nothing was created
        plain = e2e.alpha.docker("create", "--name", "sysctl2", IMAGE, "true")
        assert plain.returncode == 0, plain.stderr
        connect = {"Container": "sysctl2", "EndpointConfig": {spelled: opts}}
        status, answer = raw_exchange(
            e2e.alpha.gate, post("/networks/sysnet/connect", json.dumps(connect).encode())
        )
        assert status == 403 and b"sysctl" in answer, answer
        _, inspected = e2e.alpha.daemon_api("GET", "/containers/sysctl2/json")
        assert "sysnet" not in inspected["NetworkSettings"]["Networks"]
    finally:
        e2e.alpha.docker("rm", "-f", "sysctl0", "sysctl2")
        e2e.alpha.docker("network", "rm", "sysnet")
