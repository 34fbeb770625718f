"""What a repo's uplink may not reach, computed from the host's addresses and routes, and the
netfilter rules that say so inside the repo's namespace."""

from __future__ import annotations

from pathlib import Path

from rediacc_core.runtime import daemon, netns

# `ip -4 -j addr` and `ip -4 -j route` of a host with a system Docker and a libvirt bridge.
ADDRESSES = [
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "192.0.2.2", "prefixlen": 24}]},
    {"ifname": "docker0", "addr_info": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]},
    {"ifname": "virbr0", "addr_info": [{"family": "inet", "local": "192.168.122.1", "prefixlen": 24}]},
]
ROUTES = [
    {"dst": "default", "gateway": "192.0.2.1", "dev": "eth0"},
    {"dst": "192.0.2.0/24", "dev": "eth0", "scope": "link", "prefsrc": "192.0.2.2"},
    {"dst": "172.17.0.0/16", "dev": "docker0", "scope": "link", "prefsrc": "172.17.0.1"},
    {"dst": "192.168.122.0/24", "dev": "virbr0", "scope": "link", "prefsrc": "192.168.122.1"},
    {"dst": "10.8.0.0/16", "gateway": "192.0.2.9", "dev": "eth0"},
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
    assert not [cidr for cidr in blocked if cidr.startswith("127.")]  # the namespace's own loopback


def test_ipv6_and_an_empty_host_leave_only_the_fixed_destinations() -> None:
    v6 = [{"ifname": "eth0", "addr_info": [{"family": "inet6", "local": "fd00::2", "prefixlen": 64}]}]
    assert netns.blocked_destinations(v6, []) == sorted(netns.ALWAYS_BLOCKED)


def test_the_rules_replace_the_chain_in_one_step() -> None:
    text = netns.uplink_rules(["169.254.0.0/16", "192.0.2.2/32"])
    lines = text.splitlines()
    assert lines[0] == "*filter" and lines[-1] == "COMMIT"
    assert f":{netns.CHAIN} - [0:0]" in lines  # declared: iptables-restore --noflush empties it first
    # Only on the way out through the uplink: the repo's own bridges may use any subnet.
    assert f"-A {netns.CHAIN} -o tap0 -d 192.0.2.2/32 -j REJECT --reject-with icmp-admin-prohibited" in lines


def test_the_daemon_runs_inside_the_namespace_and_manages_only_its_iptables() -> None:
    network = netns.network_for("0123456789ab", Path("/run/rediacc/0123456789ab"))
    paths = daemon.DaemonPaths(Path("/run/rediacc/0123456789ab/d"), Path("/var/lib/rediacc/repos/x/docker"))
    argv = daemon.dockerd_argv(paths, network=network)
    assert argv[0].endswith("nsenter") and argv[1] == "--net=/run/netns/rdc-0123456789ab"
    assert argv[argv.index("--") + 1 :] == ["dockerd", "--config-file", str(paths.config)]
    inside = daemon.daemon_config(Path("/m"), paths, network=network)
    assert inside["iptables"] is True and inside["ip-forward"] is True
    assert inside["dns"] == [netns.UPLINK_DNS]
    outside = daemon.daemon_config(Path("/m"), paths)
    assert outside["iptables"] is False and outside["ip-forward"] is False  # the host's are left alone
    assert outside["bridge"] == "none" and "bridge" not in inside  # docker0 only inside the namespace
