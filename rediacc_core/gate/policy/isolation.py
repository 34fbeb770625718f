"""What keeps a container inside its own namespaces, cgroup and security profile.

Each rule admits a known-safe set and refuses the rest, naming the field and the safe alternative.
The sets follow Kubernetes Pod Security `baseline`/`restricted` where they have a counterpart, and are
stricter where a repo's tenant could otherwise reach the host or another repo (SECURITY.md has the
table). A repo's daemon holds only that repo's containers, so `container:<id>` namespaces are the
repo's own and pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.wire.decode import is_empty

# What to use instead of `/build?version=2` (BuildKit behind /build, with no place for the gate to
# check its steps).
BUILDKIT_INSTEAD = (
    "docker build with buildx installed (BuildKit through /grpc, whose build steps the gate checks), "
    "or DOCKER_BUILDKIT=0 docker build (the classic builder)"
)

# Docker's default capability set: adding one of these changes nothing.
DEFAULT_CAPABILITIES = frozenset(
    {
        "CHOWN",
        "DAC_OVERRIDE",
        "FSETID",
        "FOWNER",
        "MKNOD",
        "NET_RAW",
        "SETGID",
        "SETUID",
        "SETFCAP",
        "SETPCAP",
        "NET_BIND_SERVICE",
        "SYS_CHROOT",
        "KILL",
        "AUDIT_WRITE",
    }
)
# Never, whatever the machine allows: each reaches the host, its devices or other repos' processes.
HOST_CAPABILITIES = frozenset(
    {
        "ALL",
        "SYS_ADMIN",
        "SYS_RAWIO",
        "SYS_MODULE",
        "SYS_PTRACE",
        "DAC_READ_SEARCH",
        "SYS_BOOT",
        "SYS_TIME",
        "BPF",
        "PERFMON",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "SYSLOG",
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "SYS_PACCT",
        "CHECKPOINT_RESTORE",
        "LINUX_IMMUTABLE",
        "SYS_RESOURCE",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
    }
)
# What an operator may allow per machine (`extra-capabilities`): confined to the container's own
# namespaces.
GRANTABLE_CAPABILITIES = frozenset(
    {"NET_ADMIN", "NET_BROADCAST", "IPC_LOCK", "IPC_OWNER", "SYS_NICE", "SYS_TTY_CONFIG", "LEASE"}
)
# Kubernetes' safe sysctls: namespaced, and unable to affect other pods or the node.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
# The paths Docker masks and makes read-only by default (daemon/oci defaults, Engine 25-28). A
# request that lists these fields replaces the defaults, so it must keep every one of them.
DEFAULT_MASKED_PATHS = (
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
)
DEFAULT_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
LOG_DRIVERS = frozenset({"", "json-file", "local", "none"})
NETWORK_DRIVERS = frozenset({"", "bridge", "null"})
NETWORK_OPTIONS = frozenset(
    {
        "com.docker.network.bridge.enable_icc",
        "com.docker.network.bridge.enable_ip_masquerade",
        "com.docker.network.bridge.host_binding_ipv4",
        "com.docker.network.driver.mtu",
        "com.docker.network.container_iface_prefix",
    }
)
BUILD_PARAMETERS = frozenset(
    {
        "dockerfile", "t", "extrahosts", "remote", "q", "nocache", "cachefrom", "pull", "rm", "forcerm",
        "memory", "memswap", "cpushares", "cpusetcpus", "cpusetmems", "cpuperiod", "cpuquota", "buildargs",
        "shmsize", "squash", "labels", "networkmode", "platform", "target", "outputs", "version", "session",
        "buildid", "ulimits", "isolation", "cgroupparent",
    }
)  # fmt: skip
BUILD_NETWORKS = frozenset({"", "default", "bridge", "none"})
NAMESPACE_FIELDS = ("NetworkMode", "PidMode", "IpcMode", "UTSMode", "UsernsMode", "CgroupnsMode", "Cgroup")


def cgroupns_default(host: dict[str, Any], version: tuple[int, int] | None) -> None:
    """Write a private cgroup namespace into a create's HostConfig for API versions before 1.41.

    For those, dockerd on a cgroup v1 host replaces an empty CgroupnsMode with `host` (what old
    clients expected), around the repo daemon's private default; a mode the request names it keeps.
    """
    if version is not None and version < (1, 41) and not host.get("CgroupnsMode"):
        host["CgroupnsMode"] = "private"


def capability_name(cap: str) -> str:
    return cap.upper().removeprefix("CAP_")


def _namespaces(host: Mapping[str, Any], where: str) -> Iterator[Finding]:
    for field in NAMESPACE_FIELDS:
        value = host.get(field)
        if not isinstance(value, str) or not value:
            continue
        if value == "host" or (field == "Cgroup" and not value.startswith("container:")):
            yield refuse(
                "namespace",
                f"{field}={value}",
                f"{where}{field}={value} is refused: the host's namespaces reach every repo on the machine",
                "the default (private), or container:<id> of a container in this repo",
            )


def capabilities(caps: Any, field: str, extra: frozenset[str]) -> Iterator[Finding]:
    for cap in caps or []:
        if not isinstance(cap, str):
            continue
        name = capability_name(cap)
        if name in DEFAULT_CAPABILITIES or (name in extra and name not in HOST_CAPABILITIES):
            continue
        if name in HOST_CAPABILITIES:
            message = f"{field} {cap} is refused: it reaches the host around every other rule"
            instead = "no extra capability; devices come from CDI grants"
        elif name in GRANTABLE_CAPABILITIES:
            message = f"{field} {cap} is refused: this machine does not allow it"
            instead = f"ask the operator: rdc machine config M --set extra-capabilities={name}"
        else:
            message = f"{field} {cap} is refused: not a capability the gate knows"
            instead = "Docker's default capabilities"
        yield refuse("capability", cap, message, instead)


def _security_options(options: Any) -> Iterator[Finding]:
    for option in options or []:
        if not isinstance(option, str):
            continue
        key, sep, value = option.partition("=" if "=" in option else ":")
        key = key.strip()
        if key == "no-new-privileges" and (not sep or value.strip().lower() in ("true", "1", "t")):
            continue
        if key == "label" and value.startswith("level:"):
            continue
        if key == "apparmor" and value == "docker-default":
            continue
        yield refuse(
            "security-opt",
            option,
            f"HostConfig.SecurityOpt {option!r} is refused: containers keep the daemon's default seccomp, "
            "AppArmor and SELinux confinement, masked /proc and /sys paths and no-new-privileges",
            "no --security-opt (or no-new-privileges, label=level:...)",
        )


def _path_lists(host: Mapping[str, Any]) -> Iterator[Finding]:
    for field, defaults in (("MaskedPaths", DEFAULT_MASKED_PATHS), ("ReadonlyPaths", DEFAULT_READONLY_PATHS)):
        value = host.get(field)
        if value is None:
            continue  # null: the daemon's defaults
        missing = [p for p in defaults if p not in value]
        if missing:
            yield refuse(
                "masked-paths",
                field,
                f"HostConfig.{field} drops {', '.join(missing)}: the defaults may only be extended",
                f"leave {field} out (the defaults apply)",
            )


def _sysctls(sysctls: Any, field: str) -> Iterator[Finding]:
    for name in sysctls or {}:
        if name not in SAFE_SYSCTLS:
            yield refuse(
                "sysctl",
                name,
                f"{field} {name} is refused: only Kubernetes' safe namespaced sysctls pass",
                "one of " + ", ".join(sorted(SAFE_SYSCTLS)),
            )


# Per-interface sysctls of a network endpoint (API 1.46+): `DriverOpts` of an endpoint, a
# comma-separated list of `net.ipv4.conf.IFNAME.forwarding=1` whose IFNAME the daemon fills in.
ENDPOINT_SYSCTLS = "com.docker.network.endpoint.sysctls"


def endpoint_sysctls(endpoints: Any, where: str) -> Iterator[Finding]:
    """The sysctls that endpoints ask for through their driver options, under the container policy."""
    for network, endpoint in (endpoints or {}).items() if isinstance(endpoints, Mapping) else ():
        options = endpoint.get("DriverOpts") if isinstance(endpoint, Mapping) else None
        raw = options.get(ENDPOINT_SYSCTLS) if isinstance(options, Mapping) else None
        if raw is None:
            continue
        if not isinstance(raw, str):
            yield refuse(
                "sysctl",
                ENDPOINT_SYSCTLS,
                f"{where}{network}.DriverOpts {ENDPOINT_SYSCTLS} must be a string",
                "leave it out",
            )
            continue
        names = {item.split("=", 1)[0].strip(): "" for item in raw.split(",") if item.strip()}
        yield from _sysctls(names, f"{where}{network}.DriverOpts {ENDPOINT_SYSCTLS}:")


def resources(res: Mapping[str, Any], where: str) -> Iterator[Finding]:
    """The non-device Resources fields that reach past the container's own cgroup."""
    parent = res.get("CgroupParent")
    if parent:
        yield refuse(
            "cgroup-parent",
            parent,
            f"{where}CgroupParent {parent!r} is refused: the container must stay in its daemon's cgroup",
            "leave CgroupParent out",
        )
    if res.get("OomKillDisable") is True:
        yield refuse(
            "oom",
            "OomKillDisable",
            f"{where}OomKillDisable is refused: the kernel must be able to stop a runaway container",
            "a memory limit (--memory)",
        )


def host_config(host: Mapping[str, Any], extra_caps: frozenset[str]) -> Iterator[Finding]:
    where = "HostConfig."
    yield from _namespaces(host, where)
    yield from capabilities(host.get("CapAdd"), "HostConfig.CapAdd", extra_caps)
    yield from _security_options(host.get("SecurityOpt"))
    yield from _path_lists(host)
    yield from _sysctls(host.get("Sysctls"), "HostConfig.Sysctls")
    yield from resources(host, where)
    score = host.get("OomScoreAdj")
    if isinstance(score, int) and score < 0:
        yield refuse(
            "oom",
            "OomScoreAdj",
            f"HostConfig.OomScoreAdj {score} is refused: it would make the OOM killer spare it over the host",
            "an OomScoreAdj of 0 or more",
        )
    isolation = host.get("Isolation") or ""
    if isolation not in ("", "default"):
        yield refuse("isolation", isolation, f"HostConfig.Isolation {isolation!r} is refused", "the default")
    log = host.get("LogConfig") or {}
    driver = log.get("Type") or "" if isinstance(log, dict) else ""
    if driver not in LOG_DRIVERS:
        yield refuse(
            "log-driver",
            driver,
            f"HostConfig.LogConfig.Type {driver!r} is refused: "
            "it makes the daemon write or connect outside the repo",
            "json-file, local or none",
        )
    for key in host.get("StorageOpt") or {}:
        if key != "size":
            yield refuse(
                "storage-opt", key, f"HostConfig.StorageOpt {key!r} is refused", "StorageOpt size only"
            )


def network_create(body: Mapping[str, Any]) -> Iterator[Finding]:
    driver = body.get("Driver") or ""
    if driver not in NETWORK_DRIVERS:
        yield refuse(
            "network-driver",
            driver,
            f"network driver {driver!r} is refused: it attaches containers to the host's own interfaces",
            "the bridge driver (the default)",
        )
    for option in body.get("Options") or {}:
        if option not in NETWORK_OPTIONS:
            yield refuse(
                "network-option",
                option,
                f"network option {option} is refused (it can name a host bridge or interface)",
                "the default bridge options",
            )
    for field in ("ConfigFrom", "Ingress", "ConfigOnly"):
        if body.get(field):
            yield refuse(
                "network-driver", field, f"network {field} is refused (swarm and config-only networks)", None
            )
    if (body.get("Scope") or "local") != "local":
        yield refuse(
            "network-driver", "Scope", f"network scope {body.get('Scope')!r} is refused", "scope local"
        )
    ipam = body.get("IPAM") or {}
    if not isinstance(ipam, dict):
        return
    if (ipam.get("Driver") or "default") != "default":
        yield refuse("network-driver", "IPAM.Driver", "IPAM drivers other than the default are refused", None)
    config = ipam.get("Config")
    if any(not is_empty(entry) for entry in (config if isinstance(config, list) else [config])):
        # A repo on an existing daemon (`docker_host`) has its bridges in the host's routing table,
        # where a narrower subnet of the tenant's choosing would take the host's or another
        # network's traffic. A repo's own daemon has a namespace of its own; the rule is kept for
        # both so that one policy holds whatever daemon a repo uses.
        yield refuse(
            "network-subnet",
            "IPAM.Config",
            "network IPAM.Config (a subnet, IP range, gateway or auxiliary address of your choosing) is "
            "refused: on a shared daemon a subnet of your choosing would take other networks' traffic",
            "let the daemon choose the subnet (docker network create without --subnet, --ip-range or "
            "--gateway; no ipam.config in Compose)",
        )


def build_query(query: Mapping[str, tuple[str, ...]]) -> Iterator[Finding]:
    for name in query:
        if name not in BUILD_PARAMETERS:
            yield refuse(
                "build-option",
                name,
                f"build parameter {name!r} is refused: the gate does not know what it does",
                "the docker build options",
            )
    for value in query.get("networkmode", ()):
        if value not in BUILD_NETWORKS:
            yield refuse(
                "build-option",
                "networkmode",
                f"build networkmode={value} is refused: build steps must not join the host's or "
                "another container's network",
                "--network default or none",
            )
    for value in query.get("cgroupparent", ()):
        if value:
            yield refuse("cgroup-parent", "cgroupparent", f"build cgroupparent={value} is refused", None)
    for value in query.get("version", ()):
        if value not in ("", "1"):
            # version=2 is BuildKit behind /build: the daemon makes the frontend's attributes from
            # the query itself, so the gate cannot pin the built-in frontend there (buildkit.py), and
            # a `# syntax=` line would hand the build to a frontend image sending its own steps.
            yield refuse(
                "build-option",
                "version",
                f"build version={value} (BuildKit behind /build) is refused: a `# syntax=` frontend image "
                "would send build steps the gate never sees (a cgroup parent)",
                BUILDKIT_INSTEAD,
            )
    for value in query.get("isolation", ()):
        if value not in ("", "default"):
            yield refuse("isolation", "isolation", f"build isolation={value} is refused", "the default")
