"""The host ports a container may publish: read as the daemon reads `PortBindings` and `-P`, refused
outside the machine's `publish-ports`, past its `publish-limit` (counting what the repo's keeper
publishes now), or on a port another repo's keeper publishes; checked at create and again at start."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rediacc_core.gate.decide.containers import Container, container_from_inspect
from rediacc_core.gate.policy.publish import Binding, bindings
from rediacc_core.publishing import short_id, state_file, write_state
from rediacc_core.repos import RepoStore
from rediacc_core.settings import set_setting

Gate = Any  # tests/gate/conftest.py's Gate
ALPHA = "6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11"  # conftest's REPO
BETA = "0b7e2c55-9a1f-4c3e-8d2a-5e6f7a8b9c0d"


def _ports(table: dict[str, Any], *, all_ports: bool = False) -> dict[str, Any]:
    host: dict[str, Any] = {"PortBindings": table}
    if all_ports:
        host["PublishAllPorts"] = True
    return host


def _one(host: str, ip: str = "") -> list[dict[str, str]]:
    return [{"HostIp": ip, "HostPort": host}]


@pytest.mark.parametrize(
    ("host", "exposed", "found"),
    [
        (_ports({"80/tcp": _one("8080")}), [], [Binding("80/tcp", "tcp", 8080, 8080)]),
        (_ports({"80": _one("8080")}), [], [Binding("80", "tcp", 8080, 8080)]),  # no protocol: tcp
        (_ports({"53/UDP": _one("8053")}), [], [Binding("53/UDP", "udp", 8053, 8053)]),
        (_ports({"80/tcp": _one("")}), [], [Binding("80/tcp", "tcp", 0, 0)]),  # any free port
        (_ports({"80/tcp": _one("0")}), [], [Binding("80/tcp", "tcp", 0, 0)]),
        (_ports({"80/tcp": [{}]}), [], [Binding("80/tcp", "tcp", 0, 0)]),
        (_ports({"80/tcp": _one("8000-8100")}), [], [Binding("80/tcp", "tcp", 8000, 8100)]),
        (_ports({"80/tcp": _one("8080/udp")}), [], [Binding("80/tcp", "tcp", 8080, 8080)]),  # suffix dropped
        (_ports({"80/tcp": _one("8080", "::")}), [], [Binding("80/tcp", "tcp", 8080, 8080)]),
        (_ports({"80/tcp": _one("8080", "0.0.0.0") + _one("8081")}), [],
         [Binding("80/tcp", "tcp", 8080, 8080), Binding("80/tcp", "tcp", 8081, 8081)]),
        # Stays inside the namespace: one inside address, or a protocol the uplink does not forward.
        (_ports({"80/tcp": _one("80", "127.0.0.1")}), [], []),
        (_ports({"80/sctp": _one("80")}), [], []),
        (_ports({"80/tcp": None}), [], []),
        # -P: every exposed port without a binding, on any free port.
        (_ports({"80/tcp": _one("8080")}, all_ports=True), ["80/tcp", "443/tcp", "9/sctp"],
         [Binding("80/tcp", "tcp", 8080, 8080), Binding("443/tcp", "tcp", 0, 0)]),
        (_ports({}), ["443/tcp"], []),  # exposed, not published
    ],
)  # fmt: skip
def test_bindings_are_read_as_the_daemon_reads_them(
    host: dict[str, Any], exposed: list[str], found: list[Binding]
) -> None:
    assert bindings(host, exposed) == (found, [])


@pytest.mark.parametrize("port", ["http", "9-8", "70000", "-5", "0-10", " 80"])
def test_a_host_port_that_does_not_read_is_refused(port: str) -> None:
    found, problems = bindings(_ports({"80/tcp": _one(port)}), [])
    assert found == []
    assert [p.refusal.rule for p in problems] == ["publish-port"]
    assert f"host port {port!r} is not a port or LOW-HIGH range" in problems[0].refusal.message


# Each HostIp spelling of every address, as the daemon binds it (tests/gate/test_goip.py has the
# reader's table): what Go's net.ParseIP does not read binds the daemon's default, every address.
EVERY_ADDRESS = [
    "", "0.0.0.0", "::", "[::1]", "[::]", "[0.0.0.0]", "0.0.0.0 ", " ::", "\t0.0.0.0", "127.000.000.001",
    "127.0.0.01", "::1%lo", "fe80::1%eth0", "::%lo", "::ffff:0.0.0.0", "::ffff:0:0", "0:0:0:0:0:0:0:0",
    "::0", "0::", "::0.0.0.0", "localhost", "127.1",
]  # fmt: skip
ONE_ADDRESS = ["127.0.0.1", "::1", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1", "10.0.2.100", "fe80::1"]


@pytest.mark.parametrize("host_ip", EVERY_ADDRESS)
def test_a_host_ip_the_daemon_binds_on_every_address_is_held_to_the_policy(gate: Gate, host_ip: str) -> None:
    body: dict[str, Any] = {"Image": "bb", "HostConfig": {"PortBindings": {"80/tcp": _one("80", host_ip)}}}
    assert "host port 80/tcp is refused" in refused(gate.create(body))
    body["HostConfig"]["PortBindings"]["80/tcp"] = _one("8080", host_ip)
    assert gate.create(body).forward
    assert bindings(body["HostConfig"], []) == ([Binding("80/tcp", "tcp", 8080, 8080)], [])


@pytest.mark.parametrize("host_ip", ONE_ADDRESS)
def test_a_host_ip_of_one_address_stays_inside_the_namespace(gate: Gate, host_ip: str) -> None:
    body: dict[str, Any] = {"Image": "bb", "HostConfig": {"PortBindings": {"80/tcp": _one("80", host_ip)}}}
    assert gate.create(body).forward
    assert bindings(body["HostConfig"], []) == ([], [])


@pytest.mark.parametrize(
    "entry",
    [
        '{"hostport": "80"}',
        '{"HOSTPORT": "80", "HostIp": ""}',
        '{"hostip": "", "hostPort": "80"}',
        '{"HostIp": "127.0.0.1", "HostPort": "80", "hostip": ""}',  # fold variants: ambiguous
        '{"HostIP": "[::1]", "HostPort": "80"}',
    ],
)
def test_binding_keys_are_read_as_go_matches_them(gate: Gate, entry: str) -> None:
    """Go's encoding/json matches `hostport` to HostPort; the gate reads the same field, or refuses."""
    raw = f'{{"Image": "bb", "HostConfig": {{"PortBindings": {{"80/tcp": [{entry}]}}}}}}'
    decision = gate.create({}, raw=raw.encode())
    assert not decision.forward
    assert decision.status == 400 or decision.rules == ("publish-port",)


def test_a_binding_field_the_daemon_does_not_know_is_refused(gate: Gate) -> None:
    binding = {"HostPort": "8080", "HostIface": "eth0"}
    body = {"Image": "bb", "HostConfig": {"PortBindings": {"80/tcp": [binding]}}}
    decision = gate.create(body)
    assert not decision.forward and decision.status == 400
    assert "unknown field in PortBinding" in str(decision.message)


def create(gate: Gate, *specs: tuple[str, str], all_ports: bool = False, image: str = "bb") -> Any:
    """A create publishing `(container port, host port)` pairs on every address."""
    table: dict[str, Any] = {}
    for inside, host in specs:
        table.setdefault(inside, []).extend(_one(host))
    return gate.create({"Image": image, "HostConfig": _ports(table, all_ports=all_ports)})


def refused(decision: Any) -> str:
    assert not decision.forward, "admitted"
    assert decision.rules == ("publish-port",)
    return str(decision.message)


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (("80/tcp", "80"), [
            "HostConfig.PortBindings 80/tcp: host port 80/tcp is refused: repos on this machine publish only "
            "on host ports 1024-65535 (those below 1024 are the host's own services')",
            "use instead: a host port in 1024-65535 (-p 8080:80), "
            "or the operator's rdc machine config m1 --set publish-ports=80-65535",
        ]),
        (("53/udp", "53"),
         ["host port 53/udp is refused", "(-p 8053:53/udp)", "--set publish-ports=53-65535"]),
        (("80/tcp", "1000-1100"), ["host port 1000-1100/tcp is refused", "--set publish-ports=1000-65535"]),
        (("22/tcp", "1"), ["host port 1/tcp is refused", "(-p 8022:22)"]),
    ],
)  # fmt: skip
def test_a_host_port_below_the_range_is_refused_naming_it_the_range_and_what_to_do(
    gate: Gate, spec: tuple[str, str], says: list[str]
) -> None:
    message = refused(create(gate, spec))
    for part in says:
        assert part in message


@pytest.mark.parametrize(
    "spec",
    [("80/tcp", "8080"), ("80/tcp", "1024"), ("80/tcp", "65535"), ("80/tcp", "2000-2100"), ("80/tcp", "")],
)
def test_host_ports_in_the_range_and_any_free_one_are_admitted(gate: Gate, spec: tuple[str, str]) -> None:
    assert create(gate, spec).forward


def test_the_operator_moves_the_range_and_the_gate_follows(gate: Gate) -> None:
    set_setting(gate.fm.machine, "publish-ports", "80-65535")
    assert create(gate, ("80/tcp", "80")).forward
    set_setting(gate.fm.machine, "publish-ports", "8000-8999")
    message = refused(create(gate, ("80/tcp", "9000")))
    assert "only on host ports 8000-8999" in message and "(-p 8080:80)" in message
    assert "--set publish-ports=8000-9000" in message
    # Any free port is dockerd's pick from 32768-60999, which this range does not hold.
    message = refused(create(gate, ("80/tcp", "")))
    assert "any free host port is refused: dockerd picks it from 32768-60999" in message
    assert "use instead: a host port in 8000-8999 (-p 8080:80)" in message


def test_more_host_ports_than_the_limit_are_refused_naming_it(gate: Gate) -> None:
    specs = [(f"{9000 + i}/tcp", str(9000 + i)) for i in range(64)]
    assert create(gate, *specs).forward
    message = refused(create(gate, *specs, ("9999/tcp", "9999")))
    assert message == (
        "HostConfig.PortBindings: 65 more host port(s) are refused: this repo publishes 0 now and may "
        "publish at most 64 (publish-limit); use instead: fewer ports (-p for those clients need), or the "
        "operator's rdc machine config m1 --set publish-limit=65"
    )
    set_setting(gate.fm.machine, "publish-limit", "65")
    assert create(gate, *specs, ("9999/tcp", "9999")).forward


@pytest.fixture
def keeper() -> Iterator[int]:
    """A live process standing in for a port keeper (state files of dead keepers count for nothing)."""
    process = subprocess.Popen(["sleep", "300"])
    yield process.pid
    process.kill()
    process.wait()


def _keeper_state(path: Path, pid: int, ports: list[tuple[str, int]]) -> None:
    write_state(path, ports, pid)


def test_the_limit_counts_what_the_repo_publishes_now(gate: Gate, keeper: int) -> None:
    own = state_file(gate.fm.machine.run_dir, short_id(ALPHA))
    _keeper_state(own, keeper, [("tcp", 9000 + i) for i in range(60)])
    assert create(gate, *[(f"{i}/tcp", str(10000 + i)) for i in range(4)]).forward
    message = refused(create(gate, *[(f"{i}/tcp", str(10000 + i)) for i in range(5)]))
    assert "5 more host port(s) are refused: this repo publishes 60 now" in message
    # A port it publishes already is not one more (the daemon would refuse it twice inside anyway).
    assert create(gate, ("80/tcp", "9000"), *[(f"{i}/tcp", str(10000 + i)) for i in range(4)]).forward


def test_a_port_another_repo_publishes_is_refused_naming_that_repo(gate: Gate, keeper: int) -> None:
    beta = RepoStore(gate.fm.machine).create("beta")
    _keeper_state(
        state_file(gate.fm.machine.run_dir, short_id(beta.id)), keeper, [("tcp", 8080), ("udp", 8053)]
    )
    message = refused(create(gate, ("80/tcp", "8080")))
    assert message == (
        "HostConfig.PortBindings 80/tcp: host port 8080/tcp is refused: repo beta@m1 publishes it now; "
        "use instead: another host port (-p 8081:80)"
    )
    assert "repo beta@m1 publishes it now" in refused(create(gate, ("53/udp", "8053")))
    assert create(gate, ("53/tcp", "8053")).forward  # the other protocol is another port
    assert create(gate, ("80/tcp", "8081")).forward


def test_a_state_file_whose_keeper_is_gone_counts_for_nothing(gate: Gate) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    _keeper_state(state_file(gate.fm.machine.run_dir, short_id(BETA)), dead.pid, [("tcp", 8080)])
    assert create(gate, ("80/tcp", "8080")).forward


def test_publish_all_counts_the_images_exposed_ports(gate: Gate) -> None:
    exposed: dict[str, Any] = {f"{7000 + i}/tcp": {} for i in range(70)}
    gate.rebuild(image_config=lambda ref: {"ExposedPorts": exposed} if ref == "many" else None)
    message = refused(create(gate, all_ports=True, image="many"))
    assert "70 more host port(s) are refused" in message
    assert create(gate, all_ports=True, image="bb").forward
    assert create(gate, image="many").forward  # exposed, not published


# --- at start: the daemon's record of the container, under today's policy -----------------------


def _inspect(ports: dict[str, Any], *, running: bool = False, exposed: Any = None) -> dict[str, Any]:
    return {
        "Id": "c9" * 32,
        "Name": "/web",
        "State": {"Running": running},
        "Config": {"ExposedPorts": exposed or {}},
        "HostConfig": {"PortBindings": ports, "PublishAllPorts": exposed is not None},
    }


def test_the_record_of_a_container_says_what_it_publishes() -> None:
    held = container_from_inspect(_inspect({"80/tcp": _one("8080")}, exposed={"80/tcp": {}, "443/tcp": {}}))
    assert held.ports == (Binding("80/tcp", "tcp", 8080, 8080), Binding("443/tcp", "tcp", 0, 0))
    assert not held.running and container_from_inspect(_inspect({}, running=True)).running


class _Containers:
    def __init__(self, held: Container) -> None:
        self.found = held

    def lookup(self, ref: str) -> Container | None:
        return self.found if ref in (self.found.id, self.found.name) else None

    def exec_container(self, exec_id: str) -> str | None:
        return None


def start(gate: Gate, held: Container, action: str = "start") -> Any:
    gate.rebuild(containers=_Containers(held))
    return gate.post(f"/v1.45/containers/{held.name}/{action}", raw=b"", content_type=None)


def test_a_container_created_before_the_range_changed_does_not_start(gate: Gate) -> None:
    web = container_from_inspect(_inspect({"80/tcp": _one("8080")}))
    assert start(gate, web).forward
    set_setting(gate.fm.machine, "publish-ports", "9000-9999")
    message = refused(start(gate, web))
    assert message.startswith("container web: HostConfig.PortBindings 80/tcp: host port 8080/tcp is refused")


def test_a_start_is_refused_on_a_port_another_repo_took_since_create(gate: Gate, keeper: int) -> None:
    web = container_from_inspect(_inspect({"80/tcp": _one("8080")}))
    _keeper_state(state_file(gate.fm.machine.run_dir, short_id(BETA)), keeper, [("tcp", 8080)])
    assert "container web: HostConfig.PortBindings 80/tcp: host port 8080/tcp is refused: repo" in refused(
        start(gate, web)
    )


def test_a_start_counts_the_images_exposed_ports_under_the_limit(gate: Gate) -> None:
    many = container_from_inspect(_inspect({}, exposed={f"{7000 + i}/tcp": {} for i in range(65)}))
    assert "65 more host port(s) are refused" in refused(start(gate, many))


def test_restarting_a_running_container_counts_its_ports_once(gate: Gate, keeper: int) -> None:
    specs = {f"{9000 + i}/tcp": _one(str(9000 + i)) for i in range(64)}
    _keeper_state(
        state_file(gate.fm.machine.run_dir, short_id(ALPHA)), keeper, [("tcp", 9000 + i) for i in range(64)]
    )
    running = container_from_inspect(_inspect(specs, running=True))
    assert start(gate, running, "restart?t=1").forward
