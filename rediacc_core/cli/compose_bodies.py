"""The requests Compose sends for `up` of a project, from the model Compose itself builds
(`docker compose config --format json`): a volume create for each named volume, a network create for
each network, a build for each service that builds, a container create for each service.

The model has every file merged (overrides, `include`, `extends`), variables interpolated, `env_file`
read, inactive profiles dropped and every key in its long form; this module turns it into the bodies
as Compose 2.26 and 2.40 were seen to send them (recorded from their requests): short-form binds and
named volumes in `Binds`, other mounts, secret and config files (read-only binds of the file) in
`Mounts`; CDI names in `Devices` before Compose 2.30 and as a CDI device request since; `gpus:` sent
since Compose 2.30 (2.26 reads the key and drops it). A key whose field the gate checks is translated,
one it leaves free is dropped, and a key this module does not know is an error, never skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from rediacc_core.cdi.names import is_qualified_name
from rediacc_core.cli.check_docker import API, CheckedRequest, port_bindings, put_devices
from rediacc_core.errors import ValidationError
from rediacc_core.gate.wire import protowire

# Compose 2.26 and 2.40 were recorded; a Compose from 2.30 on (the first to send `gpus:` and CDI
# names as device requests) is read as 2.40 sends, an older one as 2.26 sends.
SENDS_AS_240_SINCE = (2, 30)

# Service keys whose fields the gate leaves free, or that send nothing of their own.
_FREE = frozenset(
    (
        "command", "container_name", "depends_on", "dns", "dns_opt", "dns_search", "domainname",
        "entrypoint", "extra_hosts", "group_add", "healthcheck", "hostname", "init", "labels", "links",
        "mac_address", "mem_limit", "mem_reservation", "memswap_limit", "mem_swappiness", "cpus",
        "cpu_shares", "cpu_quota", "cpu_period", "cpu_count", "cpu_percent", "cpu_rt_period",
        "cpu_rt_runtime", "cpuset", "profiles", "pull_policy", "read_only", "restart", "scale",
        "shm_size", "stdin_open", "stop_grace_period", "stop_signal", "tty", "user", "volumes_from",
        "working_dir", "platform", "networks", "expose", "image", "environment", "develop",
        "post_start", "pre_stop", "attach", "external_links", "blkio_config", "label_file",
        "use_api_socket", "models", "provider", "lifecycle_hooks", "stop_timeout",
    )
)  # fmt: skip
_CHECKED = frozenset(
    (
        "devices", "gpus", "deploy", "volumes", "privileged", "cap_add", "cap_drop", "security_opt",
        "network_mode", "pid", "ipc", "uts", "userns_mode", "cgroup", "cgroup_parent",
        "device_cgroup_rules", "runtime", "isolation", "ports", "sysctls", "tmpfs", "ulimits",
        "pids_limit", "oom_kill_disable", "oom_score_adj", "storage_opt", "annotations", "logging",
        "secrets", "configs", "build", "env_file",
    )
)  # fmt: skip
# `build:` keys that reach no query parameter the gate checks.
_BUILD_FREE = frozenset(
    (
        "context", "dockerfile", "dockerfile_inline", "args", "labels", "target", "cache_from",
        "cache_to", "tags", "platforms", "pull", "no_cache", "shm_size", "extra_hosts", "ssh",
        "secrets", "additional_contexts", "isolation", "provenance", "sbom",
    )
)  # fmt: skip


def _unknown(what: str, key: str, where: str) -> ValidationError:
    return ValidationError(
        f"rdc repo check does not know the Compose {what} {key!r} ({where}), so it cannot say what the "
        "gate would decide",
        "check the file without it, or run it: the gate decides every request itself",
    )


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value or ()]


def _mapping(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    return {k: v for k, _, v in (str(item).partition("=") for item in value or ())}


def _device_request(entry: Mapping[str, Any], capabilities: list[list[str]] | None) -> dict[str, Any]:
    count = entry.get("count")
    ids = entry.get("device_ids")
    return {
        "Driver": str(entry.get("driver") or ""),
        "Count": -1 if count in ("all", -1) else int(count or 0),
        "DeviceIDs": _strings(ids) if ids is not None else None,
        "Capabilities": capabilities,
        "Options": _mapping(entry.get("options")) or None,
    }


def _devices(service: Mapping[str, Any], version: tuple[int, int]) -> tuple[dict[str, Any], list[str]]:
    """Devices, CDI names and device requests into a HostConfig fragment (`put_devices`)."""
    requests_since = version >= SENDS_AS_240_SINCE
    devices: list[dict[str, str]] = []
    cdi: list[str] = []
    for entry in service.get("devices") or []:
        source = str(entry.get("source", ""))
        target = str(entry.get("target") or source)
        if requests_since and is_qualified_name(source) and target == source:
            cdi.append(source)
            continue
        perms = str(entry.get("permissions") or "rwm")
        devices.append({"PathOnHost": source, "PathInContainer": target, "CgroupPermissions": perms})
    # Compose 2.40's order: the CDI names, `deploy`'s reservations, then `gpus:`.
    requests: list[dict[str, Any]] = [{"Driver": "cdi", "DeviceIDs": cdi}] if cdi else []
    deploy = service.get("deploy") or {}
    reserved = ((deploy.get("resources") or {}).get("reservations") or {}).get("devices") or []
    for entry in reserved:
        caps = _strings(entry.get("capabilities"))
        requests.append(_device_request(entry, [caps] if caps else None))
    if requests_since:
        for entry in service.get("gpus") or []:
            caps = sorted({"gpu", *_strings(entry.get("capabilities"))})
            requests.append(_device_request(entry, [caps]))
    host: dict[str, Any] = {}
    put_devices(host, devices, [], requests)
    dropped = [] if requests_since or not service.get("gpus") else ["gpus"]
    return host, dropped


def _bind_string(source: str, volume: Mapping[str, Any]) -> str:
    mode = ["ro" if volume.get("read_only") else "rw"]
    selinux = (volume.get("bind") or {}).get("selinux")
    if selinux:
        mode.append(str(selinux))
    return f"{source}:{volume['target']}:{','.join(mode)}"


def _mounts(
    service: Mapping[str, Any], model: Mapping[str, Any], version: tuple[int, int]
) -> tuple[list[str], list[dict[str, Any]], dict[str, Any]]:
    """`volumes:`, `tmpfs` mounts, `secrets:` and `configs:` as Binds, Mounts and anonymous Volumes:
    a bind that needs nothing of the Mount API and a plain named volume as a bind string."""
    binds: list[str] = []
    mounts: list[dict[str, Any]] = []
    anonymous: dict[str, Any] = {}
    named = model.get("volumes") or {}
    for volume in service.get("volumes") or []:
        kind, target = str(volume.get("type", "volume")), str(volume.get("target", ""))
        source = str(volume.get("source") or "")
        bind = volume.get("bind") or {}
        options = volume.get("volume") or {}
        # Compose 2.26 mounts a bind of the long syntax (no create_host_path); 2.40 binds it too.
        plain = bind.get("create_host_path") or version >= SENDS_AS_240_SINCE
        if kind == "bind" and plain and not (bind.get("propagation") or bind.get("recursive")):
            binds.append(_bind_string(source, volume))
            continue
        if kind == "volume" and source in named:
            source = str(named[source].get("name") or source)
            if not (options.get("nocopy") or options.get("subpath")):
                binds.append(_bind_string(source, volume))
                continue
        if kind == "volume" and not source:
            anonymous[target] = {}
        mount: dict[str, Any] = {"Type": kind, "Source": source, "Target": target}
        if volume.get("read_only"):
            mount["ReadOnly"] = True
        if bind.get("propagation"):
            mount["BindOptions"] = {"Propagation": str(bind["propagation"])}
        pairs = (("NoCopy", options.get("nocopy")), ("Subpath", options.get("subpath")))
        if any(v for _, v in pairs):
            mount["VolumeOptions"] = {k: v for k, v in pairs if v}
        tmpfs = volume.get("tmpfs") or {}
        if tmpfs.get("size"):
            mount["TmpfsOptions"] = {"SizeBytes": int(tmpfs["size"])}
        mounts.append(mount)
    for key, default_dir in (("secrets", "/run/secrets/"), ("configs", "/")):
        defined = model.get(key) or {}
        for use in service.get(key) or []:
            top = defined.get(use.get("source")) or {}
            if not top.get("file"):
                continue  # from the environment or inline content: copied in, not mounted
            target = str(use.get("target") or use.get("source"))
            target = target if target.startswith("/") else default_dir + target
            mounts.append({"Type": "bind", "Source": str(top["file"]), "Target": target, "ReadOnly": True})
    return binds, mounts, anonymous


def _ports(service: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    short = []
    for port in service.get("ports") or []:
        text = f"{port['target']}/{port.get('protocol') or 'tcp'}"
        published = port.get("published")
        if published not in (None, ""):
            host_ip = str(port.get("host_ip") or "")
            host_ip = f"[{host_ip}]" if ":" in host_ip else host_ip
            text = f"{host_ip}:{published}:{text}" if host_ip else f"{published}:{text}"
        short.append(text)
    exposed, bindings = port_bindings(short, _strings(service.get("expose")))
    return exposed, bindings


def _ulimits(value: Mapping[str, Any]) -> list[dict[str, Any]]:
    limits = []
    for name, limit in value.items():
        if isinstance(limit, dict):
            limits.append(
                {"Name": name, "Soft": int(limit.get("soft", 0)), "Hard": int(limit.get("hard", 0))}
            )
        else:
            limits.append({"Name": name, "Soft": int(limit), "Hard": int(limit)})
    return limits


_STRING_FIELDS = (
    ("pid", "PidMode"), ("ipc", "IpcMode"), ("uts", "UTSMode"), ("userns_mode", "UsernsMode"),
    ("cgroup", "CgroupnsMode"), ("cgroup_parent", "CgroupParent"), ("runtime", "Runtime"),
    ("isolation", "Isolation"),
)  # fmt: skip
_LIST_FIELDS = (
    ("cap_add", "CapAdd"), ("cap_drop", "CapDrop"), ("security_opt", "SecurityOpt"),
    ("device_cgroup_rules", "DeviceCgroupRules"),
)  # fmt: skip


def _joined(value: str, model: Mapping[str, Any]) -> str:
    """`service:NAME` (another service's namespace) as Compose sends it: `container:` its container."""
    if value.startswith("service:"):
        name = value.removeprefix("service:")
        other = (model.get("services") or {}).get(name) or {}
        container = other.get("container_name") or f"{model.get('name')}-{name}-1"
        return f"container:{container}"
    return value


def _network_mode(service: Mapping[str, Any], model: Mapping[str, Any]) -> str:
    if service.get("network_mode"):
        return _joined(str(service["network_mode"]), model)
    joined = list(service.get("networks") or {})
    defined = model.get("networks") or {}
    first = joined[0] if joined else "default"
    return str((defined.get(first) or {}).get("name") or f"{model.get('name')}_{first}")


def service_body(
    name: str, service: Mapping[str, Any], model: Mapping[str, Any], version: tuple[int, int]
) -> tuple[dict[str, Any], list[str]]:
    """The container create body Compose sends for one service, and the keys it reads and drops."""
    for key in service:
        if key not in _FREE and key not in _CHECKED and not str(key).startswith("x-"):
            raise _unknown("key", str(key), f"service {name}")
    s = service.get
    host, dropped = _devices(service, version)
    host["NetworkMode"] = _network_mode(service, model)
    body: dict[str, Any] = {"Image": str(s("image") or f"{model.get('name')}-{name}"), "HostConfig": host}
    env = _mapping(s("environment"))
    if env:
        body["Env"] = [f"{k}={v}" for k, v in env.items()]
    binds, mounts, anonymous = _mounts(service, model, version)
    for field, value in (("Binds", binds), ("Mounts", mounts)):
        if value:
            host[field] = value
    if anonymous:
        body["Volumes"] = anonymous
    exposed, bindings = _ports(service)
    if exposed:
        body["ExposedPorts"] = exposed
    if bindings:
        host["PortBindings"] = bindings
    for key, field in (("privileged", "Privileged"), ("oom_kill_disable", "OomKillDisable")):
        if s(key):
            host[field] = True
    for key, field in _LIST_FIELDS:
        if s(key):
            host[field] = _strings(s(key))
    if host.get("CapAdd") and version >= SENDS_AS_240_SINCE:  # 2.40 names each as the kernel does
        host["CapAdd"] = [c if c.upper() in ("ALL",) or c.upper().startswith("CAP_") else f"CAP_{c}"
                          for c in host["CapAdd"]]  # fmt: skip
    for key, field in _STRING_FIELDS:
        if s(key):
            host[field] = _joined(str(s(key)), model)
    if s("tmpfs"):
        host["Tmpfs"] = {path: opts for path, _, opts in (t.partition(":") for t in _strings(s("tmpfs")))}
    for key, field in (("sysctls", "Sysctls"), ("storage_opt", "StorageOpt"), ("annotations", "Annotations")):
        if s(key):
            host[field] = _mapping(s(key))
    if service.get("ulimits"):
        host["Ulimits"] = _ulimits(service["ulimits"])
    pids = s("pids_limit") or (((s("deploy") or {}).get("resources") or {}).get("limits") or {}).get("pids")
    if pids:
        host["PidsLimit"] = int(pids)
    if service.get("oom_score_adj") is not None:
        host["OomScoreAdj"] = int(service["oom_score_adj"])
    logging = s("logging") or {}
    if logging.get("driver"):
        host["LogConfig"] = {"Type": str(logging["driver"]), "Config": _mapping(logging.get("options"))}
    return body, dropped


# BuildKit's solve call, which Compose's builds make (through buildx), as the gate judges it.
SOLVE = "/moby.buildkit.v1.Control/Solve"


def build_request(name: str, build: Mapping[str, Any]) -> CheckedRequest:
    """A service's `build:` as the settings of the solve request buildx sends for it: the frontend,
    its attributes and the entitlements the gate checks (the rest of the build reaches no rule)."""
    attrs: dict[str, str] = {}
    entitlements: list[str] = []
    for key, value in build.items():
        if key == "network":
            if value == "host":
                entitlements.append("network.host")
            if value not in (None, "", "default"):
                attrs["force-network-mode"] = str(value)
        elif key == "ulimits":
            attrs["ulimit"] = ",".join(f"{u['Name']}={u['Soft']}:{u['Hard']}" for u in _ulimits(value))
        elif key == "privileged":
            entitlements += ["security.insecure"] if value else []
        elif key == "entitlements":
            entitlements += _strings(value)
        elif key not in _BUILD_FREE and not str(key).startswith("x-"):
            raise _unknown("build key", str(key), f"service {name}")
    body = {"frontend": "dockerfile.v0", "attrs": attrs, "entitlements": entitlements}
    return CheckedRequest(f"build {name}", "GRPC", SOLVE, body)


def solve_message(body: Mapping[str, Any]) -> bytes:
    """`build_request`'s body as the SolveRequest message: frontend (6), its attributes (7) and
    the entitlements (9)."""
    message = protowire.length_field(6, str(body["frontend"]))
    for name, value in sorted(body["attrs"].items()):
        message += protowire.map_entry(7, name, value)
    for entitlement in body["entitlements"]:
        message += protowire.length_field(9, entitlement)
    return message


def _volume_requests(model: Mapping[str, Any]) -> list[CheckedRequest]:
    project = str(model.get("name"))
    requests = []
    for name, volume in (model.get("volumes") or {}).items():
        if volume.get("external"):
            continue
        body: dict[str, Any] = {
            "Name": str(volume.get("name") or f"{project}_{name}"),
            "Labels": {"com.docker.compose.project": project, "com.docker.compose.volume": str(name)},
        }
        if volume.get("driver"):
            body["Driver"] = str(volume["driver"])
        if volume.get("driver_opts"):
            body["DriverOpts"] = _mapping(volume["driver_opts"])
        requests.append(CheckedRequest(f"volume {name}", "POST", f"{API}/volumes/create", body))
    return requests


def _network_requests(model: Mapping[str, Any]) -> list[CheckedRequest]:
    project = str(model.get("name"))
    requests = []
    for name, network in (model.get("networks") or {}).items():
        if network.get("external"):
            continue
        body: dict[str, Any] = {
            "Name": str(network.get("name") or f"{project}_{name}"),
            "Driver": str(network.get("driver") or ""),
        }
        if network.get("driver_opts"):
            body["Options"] = _mapping(network["driver_opts"])
        if network.get("internal"):
            body["Internal"] = True
        if network.get("enable_ipv6"):
            body["EnableIPv6"] = True
        ipam = network.get("ipam") or {}
        if ipam.get("config"):
            fields = (("Subnet", "subnet"), ("Gateway", "gateway"), ("IPRange", "ip_range"))
            body["IPAM"] = {
                "Driver": str(ipam.get("driver") or "default"),
                "Config": [{key: str(e[low]) for key, low in fields if e.get(low)} for e in ipam["config"]],
            }
        requests.append(CheckedRequest(f"network {name}", "POST", f"{API}/networks/create", body))
    return requests


def from_model(
    model: Mapping[str, Any], version: tuple[int, int], services: Mapping[str, Any] | None = None
) -> tuple[list[CheckedRequest], list[str]]:
    """The requests of `docker compose up` for `model` (of `services` only, when given), and what
    this Compose reads but does not send (`service web: gpus`)."""
    project = str(model.get("name"))
    requests = [*_volume_requests(model), *_network_requests(model)]
    dropped: list[str] = []
    chosen = services if services is not None else model.get("services") or {}
    for name, service in chosen.items():
        if service.get("build") is not None:
            requests.append(build_request(name, service["build"]))
        body, lost = service_body(name, service, model, version)
        dropped += [f"service {name}: {key}" for key in lost]
        container = str(service.get("container_name") or f"{project}-{name}-1")
        target = f"{API}/containers/create?{urlencode({'name': container})}"
        requests.append(CheckedRequest(f"service {name}", "POST", target, body))
    return requests, dropped
