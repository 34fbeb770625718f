"""Namespaces, capabilities, security options, sysctls, cgroups, logging, networks and builds."""

from __future__ import annotations

from typing import Any

import pytest
from rules_kit import check, rule_context

from rediacc_core.gate.policy.isolation import DEFAULT_MASKED_PATHS
from rediacc_core.testing.fakemachine import FakeMachine


def refused(fm: FakeMachine, host: dict[str, Any], **kwargs: Any) -> list[str]:
    findings = check("container-create", {"Image": "bb", "HostConfig": host}, rule_context(fm, **kwargs))
    return [f.refusal.rule for f in findings]


@pytest.mark.parametrize(
    ("host", "rule"),
    [
        ({"PidMode": "host"}, "namespace"),
        ({"IpcMode": "host"}, "namespace"),
        ({"NetworkMode": "host"}, "namespace"),
        ({"UTSMode": "host"}, "namespace"),
        ({"UsernsMode": "host"}, "namespace"),
        ({"CgroupnsMode": "host"}, "namespace"),
        ({"Cgroup": "host"}, "namespace"),
        ({"CapAdd": ["DAC_READ_SEARCH"]}, "capability"),
        ({"CapAdd": ["SYS_PTRACE"]}, "capability"),
        ({"CapAdd": ["cap_sys_boot"]}, "capability"),
        ({"CapAdd": ["SYS_TIME"]}, "capability"),
        ({"CapAdd": ["BPF"]}, "capability"),
        ({"CapAdd": ["PERFMON"]}, "capability"),
        ({"CapAdd": ["NET_ADMIN"]}, "capability"),  # not allowed on this machine
        ({"CapAdd": ["MADE_UP"]}, "capability"),
        ({"SecurityOpt": ["seccomp=unconfined"]}, "security-opt"),
        ({"SecurityOpt": ["seccomp={}"]}, "security-opt"),
        ({"SecurityOpt": ["apparmor=unconfined"]}, "security-opt"),
        ({"SecurityOpt": ["label=disable"]}, "security-opt"),
        ({"SecurityOpt": ["label:disable"]}, "security-opt"),
        ({"SecurityOpt": ["label=type:spc_t"]}, "security-opt"),
        ({"SecurityOpt": ["systempaths=unconfined"]}, "security-opt"),
        ({"SecurityOpt": ["no-new-privileges=false"]}, "security-opt"),
        ({"MaskedPaths": []}, "masked-paths"),
        ({"ReadonlyPaths": ["/proc/bus"]}, "masked-paths"),
        ({"Sysctls": {"kernel.core_pattern": "|/tmp/x"}}, "sysctl"),
        ({"Sysctls": {"net.ipv4.ip_forward": "1"}}, "sysctl"),
        ({"CgroupParent": "/"}, "cgroup-parent"),
        ({"OomKillDisable": True}, "oom"),
        ({"OomScoreAdj": -1000}, "oom"),
        ({"Isolation": "hyperv"}, "isolation"),
        ({"LogConfig": {"Type": "syslog", "Config": {"syslog-address": "unix:///dev/log"}}}, "log-driver"),
        ({"LogConfig": {"Type": "fluentd"}}, "log-driver"),
        ({"StorageOpt": {"dm.basesize": "1G"}}, "storage-opt"),
        ({"Tmpfs": {"/t": "rw,dev"}}, "tmpfs-option"),
        ({"VolumeDriver": "vendor-nfs"}, "volume-driver"),
    ],
)
def test_refused(fake_machine: FakeMachine, host: dict[str, Any], rule: str) -> None:
    assert refused(fake_machine, host) == [rule]


@pytest.mark.parametrize(
    "host",
    [
        {"PidMode": "container:abc", "IpcMode": "shareable", "NetworkMode": "bridge", "UTSMode": ""},
        {"NetworkMode": "none", "CgroupnsMode": "private", "Cgroup": "container:abc"},
        {"NetworkMode": "repo_default", "IpcMode": "container:abc"},
        {"CapAdd": ["NET_BIND_SERVICE", "CAP_CHOWN", "kill"], "CapDrop": ["ALL"]},
        {"SecurityOpt": ["no-new-privileges", "no-new-privileges:true", "label=level:s0:c100,c200"]},
        {"MaskedPaths": None, "ReadonlyPaths": None},
        {"MaskedPaths": [*DEFAULT_MASKED_PATHS, "/proc/extra"]},
        {"Sysctls": {"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shm_rmid_forced": "1"}},
        {"OomScoreAdj": 500, "OomKillDisable": False, "CgroupParent": ""},
        {"LogConfig": {"Type": "json-file", "Config": {"max-size": "10m"}}},
        {"LogConfig": {"Type": "local"}},
        {"StorageOpt": {"size": "10G"}},
        {"Tmpfs": {"/run": "rw,noexec,nosuid,size=65536k"}},
        {"VolumeDriver": "local"},
    ],
)
def test_admitted(fake_machine: FakeMachine, host: dict[str, Any]) -> None:
    assert refused(fake_machine, host) == []


def test_the_machine_may_allow_namespaced_capabilities(fake_machine: FakeMachine) -> None:
    allowed = frozenset({"NET_ADMIN"})
    assert refused(fake_machine, {"CapAdd": ["NET_ADMIN"]}, extra_capabilities=allowed) == []
    # Never the ones that reach the host, even if a hand-edited setting lists them.
    assert refused(fake_machine, {"CapAdd": ["SYS_ADMIN"]}, extra_capabilities=frozenset({"SYS_ADMIN"})) == [
        "capability"
    ]


def test_messages_name_the_field_and_the_alternative(fake_machine: FakeMachine) -> None:
    body = {"HostConfig": {"PidMode": "host"}}
    (finding,) = check("container-create", body, rule_context(fake_machine))
    assert "HostConfig.PidMode=host is refused" in finding.refusal.message
    assert finding.refusal.replacement and "container:<id>" in finding.refusal.replacement


@pytest.mark.parametrize(
    ("body", "refused_rules"),
    [
        ({"Driver": "macvlan", "Options": {"parent": "eth0"}}, ["network-driver", "network-option"]),
        ({"Driver": "ipvlan"}, ["network-driver"]),
        ({"Driver": "bridge", "Options": {"com.docker.network.bridge.name": "docker0"}}, ["network-option"]),
        ({"Driver": "bridge", "ConfigFrom": {"Network": "x"}}, ["network-driver"]),
        ({"Driver": "bridge", "IPAM": {"Driver": "vendor"}}, ["network-driver"]),
        # A subnet of the tenant's choosing takes routes from other repos or the host.
        ({"Driver": "bridge", "IPAM": {"Config": [{"Subnet": "172.31.0.0/25"}]}}, ["network-subnet"]),
        ({"IPAM": {"Config": [{"Gateway": "10.0.0.1"}]}}, ["network-subnet"]),
        ({"IPAM": {"Config": [{}, {"IPRange": "10.0.0.0/28"}]}}, ["network-subnet"]),
        ({"IPAM": {"Config": [{"AuxiliaryAddresses": {"a": "10.0.0.9"}}]}}, ["network-subnet"]),
        ({"IPAM": {"Config": "172.31.0.0/25"}}, ["network-subnet"]),
        ({"IPAM": {"Driver": "default", "Config": [], "Options": {}}}, []),
        ({"IPAM": {"Config": [{}]}}, []),
        ({"Name": "app_default", "Driver": "bridge", "Labels": {"a": "b"}}, []),
        ({"Name": "n", "Options": {"com.docker.network.driver.mtu": "1400"}, "Internal": True}, []),
    ],
)
def test_network_create(fake_machine: FakeMachine, body: dict[str, Any], refused_rules: list[str]) -> None:
    findings = check("network-create", body, rule_context(fake_machine))
    assert [f.refusal.rule for f in findings] == refused_rules


@pytest.mark.parametrize(
    ("query", "refused_rules"),
    [
        ({"networkmode": ("host",)}, ["build-option"]),
        ({"networkmode": ("container:abc",)}, ["build-option"]),
        ({"cgroupparent": ("/system.slice",)}, ["cgroup-parent"]),
        ({"isolation": ("hyperv",)}, ["isolation"]),
        ({"remote": ("git@internal.example:secrets.git",)}, ["git-remote"]),  # the host's SSH keys
        ({"version": ("2",)}, ["build-option"]),  # BuildKit: a `# syntax=` frontend sends its own steps
        ({"remote": ("https://example.com/app.git#main",)}, ["git-remote"]),  # submodules over ssh
        ({"remote": ("https://example.com/context.tar.gz",)}, []),
        ({"something": ("1",)}, ["build-option"]),
        ({"t": ("app:1",), "networkmode": ("default",), "cgroupparent": ("",), "version": ("1",)}, []),
    ],
)
def test_build_parameters(
    fake_machine: FakeMachine, query: dict[str, tuple[str, ...]], refused_rules: list[str]
) -> None:
    findings = check("build", None, rule_context(fake_machine, query=query))
    assert [f.refusal.rule for f in findings] == refused_rules


def test_the_host_network_cannot_be_joined_as_an_extra_endpoint(fake_machine: FakeMachine) -> None:
    body = {"Image": "bb", "NetworkingConfig": {"EndpointsConfig": {"host": {}, "app_default": {}}}}
    findings = check("container-create", body, rule_context(fake_machine))
    assert [f.refusal.rule for f in findings] == ["namespace"]


@pytest.mark.parametrize(
    "host",
    [
        {"CapAdd": [7, None], "SecurityOpt": [1]},  # not strings: left to the daemon's decoder to refuse
        {"SecurityOpt": ["apparmor=docker-default"]},  # the daemon's own profile, named
    ],
)
def test_admitted_at_the_edges(fake_machine: FakeMachine, host: dict[str, Any]) -> None:
    assert refused(fake_machine, host) == []


def test_a_network_scoped_beyond_this_machine_is_refused(fake_machine: FakeMachine) -> None:
    findings = check("network-create", {"Name": "n", "Scope": "swarm"}, rule_context(fake_machine))
    assert [f.refusal.rule for f in findings] == ["network-driver"]


# --- per-interface sysctls of a network endpoint (API 1.46+), under the container sysctl policy ----

SYSCTLS_OPT = "com.docker.network.endpoint.sysctls"


def endpoint(sysctls: object) -> dict[str, Any]:
    return {"DriverOpts": {SYSCTLS_OPT: sysctls}}


@pytest.mark.parametrize(
    ("sysctls", "refused_names"),
    [
        ("net.ipv4.conf.IFNAME.forwarding=1", ["net.ipv4.conf.IFNAME.forwarding"]),
        (
            "net.ipv4.conf.IFNAME.proxy_arp=1,net.ipv6.conf.IFNAME.accept_ra=2",
            ["net.ipv4.conf.IFNAME.proxy_arp", "net.ipv6.conf.IFNAME.accept_ra"],
        ),
        ("net.ipv4.ip_unprivileged_port_start=0", []),  # a safe namespaced sysctl passes here as in Sysctls
        ("", []),
    ],
)
def test_endpoint_sysctls_of_a_create_go_through_the_sysctl_policy(
    fake_machine: FakeMachine, sysctls: str, refused_names: list[str]
) -> None:
    body = {
        "Image": "bb",
        "HostConfig": {},
        "NetworkingConfig": {"EndpointsConfig": {"net1": endpoint(sysctls)}},
    }
    findings = check("container-create", body, rule_context(fake_machine))
    assert [(f.refusal.rule, f.subject) for f in findings] == [("sysctl", name) for name in refused_names]
    for finding in findings:
        assert SYSCTLS_OPT in finding.refusal.message and "net1" in finding.refusal.message


def test_endpoint_sysctls_of_a_network_connect_are_checked_too(fake_machine: FakeMachine) -> None:
    body = {"Container": "c1", "EndpointConfig": endpoint("net.ipv4.conf.IFNAME.forwarding=1")}
    findings = check("network-connect", body, rule_context(fake_machine))
    assert [f.refusal.rule for f in findings] == ["sysctl"]
    assert (
        check(
            "network-connect",
            {"Container": "c1", "EndpointConfig": {"Aliases": ["a"]}},
            rule_context(fake_machine),
        )
        == []
    )


def test_endpoint_sysctls_that_are_not_a_string_are_refused(fake_machine: FakeMachine) -> None:
    body = {
        "Image": "bb",
        "HostConfig": {},
        "NetworkingConfig": {"EndpointsConfig": {"n": endpoint(["x=1"])}},
    }
    assert [f.refusal.rule for f in check("container-create", body, rule_context(fake_machine))] == ["sysctl"]
