"""What a repo's uplink may not reach, computed from the host's addresses and routes, and the
netfilter rules that say so inside the repo's namespace."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from rediacc_core.runtime import daemon, kernelpath, layout, netns, rtnetlink

V4, V6 = socket.AF_INET, socket.AF_INET6
LO, ETH0, DOCKER0, VIRBR0, TUN0 = 1, 2, 3, 4, 5


def _route(
    dst: str, oif: int | None, gateway: str | None = None, *, table: int = 254, kind: int = 1
) -> rtnetlink.Route:
    return rtnetlink.Route(V4, table, kind, dst, oif, gateway)


# The addresses and routes (main and local tables) of a host with a system Docker and a libvirt bridge.
ADDRESSES = [
    rtnetlink.Address(V4, LO, 8, "127.0.0.1"),
    rtnetlink.Address(V4, ETH0, 24, "192.0.2.2"),
    rtnetlink.Address(V4, DOCKER0, 16, "172.17.0.1"),
    rtnetlink.Address(V4, VIRBR0, 24, "192.168.122.1"),
]
ROUTES = [
    _route("0.0.0.0/0", ETH0, "192.0.2.1"),
    _route("192.0.2.0/24", ETH0),
    _route("172.17.0.0/16", DOCKER0),
    _route("192.168.122.0/24", VIRBR0),
    _route("10.8.0.0/16", ETH0, "192.0.2.9"),
    _route("127.0.0.0/8", LO, table=255, kind=rtnetlink.RTN_LOCAL),
    _route("192.0.2.2/32", ETH0, table=255, kind=rtnetlink.RTN_LOCAL),
    _route("192.0.2.255/32", ETH0, table=255, kind=3),  # broadcast
]


def test_the_uplink_reaches_none_of_the_hosts_addresses_nor_the_networks_only_the_host_reaches() -> None:
    blocked = netns.blocked_destinations(ADDRESSES, ROUTES)
    assert "192.0.2.2/32" in blocked  # the host's own services
    assert "172.17.0.0/16" in blocked and "192.168.122.0/24" in blocked  # system Docker, libvirt
    assert "169.254.0.0/16" in blocked  # the cloud metadata service


def test_the_machine_network_and_routed_networks_stay_reachable_like_the_outside() -> None:
    blocked = netns.blocked_destinations(ADDRESSES, ROUTES)
    assert "192.0.2.0/24" not in blocked  # the default route's own network: the outside, seen from here
    assert "10.8.0.0/16" not in blocked  # reached through a gateway: outside too
    assert "192.0.2.255/32" not in blocked  # the machine network's broadcast address
    assert not [cidr for cidr in blocked if cidr.startswith("127.")]  # the namespace's own loopback


def test_a_bridge_the_host_gains_later_is_refused_with_its_address() -> None:
    late = [*ADDRESSES, rtnetlink.Address(V4, 9, 24, "198.18.5.1")]
    routes = [
        *ROUTES,
        _route("198.18.5.0/24", 9),
        _route("198.18.5.1/32", 9, table=255, kind=rtnetlink.RTN_LOCAL),
    ]
    blocked = netns.blocked_destinations(late, routes)
    assert {"198.18.5.1/32", "198.18.5.0/24"} <= set(blocked)
    assert "198.18.5.0/24" not in netns.blocked_destinations(ADDRESSES, ROUTES)


def test_a_range_the_host_answers_as_its_own_is_refused_whole() -> None:
    """`ip route add local 198.18.8.0/24 dev lo`: the host answers every address in it, with no
    interface address to show for it."""
    routes = [*ROUTES, _route("198.18.8.0/24", LO, table=255, kind=rtnetlink.RTN_LOCAL)]
    assert "198.18.8.0/24" in netns.blocked_destinations(ADDRESSES, routes)


def test_routes_of_other_tables_and_types_and_loopback_routes_are_not_the_hosts_networks() -> None:
    routes = [
        *ROUTES,
        _route("198.18.10.0/24", TUN0, table=51820),  # a VPN's policy table
        _route("198.18.11.0/24", None, kind=6),  # unreachable
        _route("198.18.12.0/24", LO),  # routed into the host's loopback device
    ]
    blocked = netns.blocked_destinations(ADDRESSES, routes)
    assert not [cidr for cidr in blocked if cidr.startswith("198.18.")]


def test_without_a_default_route_every_directly_connected_network_is_refused() -> None:
    """No interface is the machine's network then (before DHCP, a VPN that took the default
    route away): all of them are the host's alone until it has one."""
    routes = [r for r in ROUTES if not r.is_default]
    assert "192.0.2.0/24" in netns.blocked_destinations(ADDRESSES, routes)


def test_ipv6_and_an_empty_host_leave_only_the_fixed_destinations() -> None:
    v6 = [rtnetlink.Address(V6, ETH0, 64, "fd00::2")]
    v6_routes = [rtnetlink.Route(V6, 254, 1, "fd00::/64", ETH0, None)]
    assert netns.blocked_destinations(v6, v6_routes) == sorted(netns.ALWAYS_BLOCKED)


def test_the_rules_replace_the_chain_in_one_step() -> None:
    text = netns.uplink_rules(["169.254.0.0/16", "192.0.2.2/32"])
    lines = text.splitlines()
    assert lines[0] == "*filter" and lines[-1] == "COMMIT"
    assert lines.index("*mangle") > lines.index("COMMIT")  # each table committed whole
    assert f":{netns.CHAIN} - [0:0]" in lines  # declared: iptables-restore --noflush empties it first
    # Only on the way out through the uplink: the repo's own bridges may use any subnet.
    assert f"-A {netns.CHAIN} -o tap0 -d 192.0.2.2/32 -j REJECT --reject-with icmp-admin-prohibited" in lines
    # The kernel path's veth too, and every repo's range: the namespace refuses them itself, should
    # the host's firewall lose the repo's chains.
    for cidr in ("10.199.0.0/16", "169.254.0.0/16", "192.0.2.2/32"):
        assert f"-A {netns.CHAIN} -o kpath0 -d {cidr} -j REJECT --reject-with icmp-admin-prohibited" in lines
    # Every refusal again as a drop in mangle, which dockerd never writes: it holds while dockerd
    # moves FORWARD's jump to DOCKER-USER.
    assert f":{netns.GUARD} - [0:0]" in lines
    for cidr in ("169.254.0.0/16", "192.0.2.2/32"):
        assert f"-A {netns.GUARD} -o tap0 -d {cidr} -j DROP" in lines
    for cidr in ("10.199.0.0/16", "169.254.0.0/16", "192.0.2.2/32"):
        assert f"-A {netns.GUARD} -o kpath0 -d {cidr} -j DROP" in lines


def test_the_daemon_runs_inside_the_namespace_and_manages_only_its_iptables() -> None:
    network = layout.network_for("0123456789ab", Path("/run/rediacc/0123456789ab"))
    paths = layout.DaemonPaths(Path("/run/rediacc/0123456789ab/d"), Path("/var/lib/rediacc/repos/x/docker"))
    argv = daemon.dockerd_argv(paths, network=network)
    assert argv[0].endswith("nsenter") and argv[1] == "--net=/run/netns/rdc-0123456789ab"
    # With no system bus: a firewalld on the host would otherwise write the daemon's rules into
    # the host's tables instead of the namespace's.
    assert argv[argv.index("--") + 1 :] == [
        "env", "DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent", "dockerd", "--config-file", str(paths.config)
    ]  # fmt: skip
    inside = daemon.daemon_config(Path("/m"), paths, network=network)
    assert inside["iptables"] is True and inside["ip-forward"] is True
    # No IPv6 leaves the namespace, so no ip6tables set-up at each start (Engine 28's default).
    assert inside["ip6tables"] is False
    assert inside["dns"] == [netns.UPLINK_DNS]
    # Every bridge, the default one and each network created later, at the uplink's MTU.
    assert inside["mtu"] == netns.UPLINK_MTU == 65520
    assert inside["default-network-opts"] == {"bridge": {"com.docker.network.driver.mtu": "65520"}}
    outside = daemon.daemon_config(Path("/m"), paths)
    assert outside["iptables"] is False and outside["ip-forward"] is False  # the host's are left alone
    assert outside["bridge"] == "none" and "bridge" not in inside  # docker0 only inside the namespace


@pytest.mark.parametrize("path", ["user", "kernel"])
def test_bring_up_writes_every_refusal_before_any_way_out_exists(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The namespace's rules and the host's chains (the kernel path's, in `apply_rules`) come
    before the uplink and the veth: a container whose restart policy starts it the moment its
    daemon is up finds them in place."""
    steps: list[str] = []
    slot = kernelpath.slot(5)
    monkeypatch.setattr(netns, "create", lambda net: steps.append("namespace"))
    monkeypatch.setattr(
        netns, "_path_for", lambda net, root, forced=None: (path, slot if path == "kernel" else None)
    )
    monkeypatch.setattr(netns, "host_destinations", lambda: ["192.0.2.7/32"])
    monkeypatch.setattr(netns, "apply_rules", lambda net, blocked: steps.append("rules"))
    monkeypatch.setattr(netns, "uplink_pid", lambda net: None)
    monkeypatch.setattr(netns, "_start_uplink", lambda net, configure: steps.append("uplink"))
    monkeypatch.setattr(kernelpath, "set_up", lambda *args: steps.append("veth"))
    monkeypatch.setattr(netns, "ports_pid", lambda net: 1)  # a keeper runs
    net = layout.network_for("0123456789ab", tmp_path / "run", tmp_path / "state")
    netns.bring_up(net, tmp_path, tmp_path / "docker.sock")
    assert steps == ["namespace", "rules", "uplink", *(["veth"] if path == "kernel" else [])]
