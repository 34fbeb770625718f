"""A Compose file as the requests Compose 2.x sends for `docker compose up`: a volume create for each
named volume it defines, a network create for each network, a container create for each service.

For `rdc repo check`, like `check_docker`: every service key that reaches a field the gate has a rule
on is translated; keys whose fields the gate leaves free are dropped; an unknown key is an error.
CDI names are sent as Compose 2.30 and later send them (a CDI device request); older Composes send
them in `Devices`, which the gate folds into the same request, so the decision is the same.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import yaml

from rediacc_core.cdi.names import is_qualified_name
from rediacc_core.cli.check_docker import (
    API,
    CheckedRequest,
    bind_volume,
    device_mapping,
    port_bindings,
    put_devices,
)
from rediacc_core.errors import ValidationError

# Service keys whose fields the gate leaves free (`gate/field_policy.py`), or that send nothing.
_FREE = frozenset(
    (
        "build", "command", "container_name", "depends_on", "dns", "dns_opt", "dns_search",
        "domainname", "entrypoint", "extra_hosts", "group_add", "healthcheck", "hostname", "init",
        "labels", "links", "mac_address", "mem_limit", "mem_reservation", "memswap_limit",
        "cpus", "cpu_shares", "cpu_quota", "cpu_period", "cpuset", "profiles", "pull_policy",
        "read_only", "restart", "scale", "shm_size", "stdin_open", "stop_grace_period",
        "stop_signal", "tty", "user", "volumes_from", "working_dir", "platform", "networks",
        "expose", "image", "environment", "env_file", "develop", "post_start", "pre_stop", "attach",
        "external_links", "configs", "secrets",
    )
)  # fmt: skip
_CHECKED = frozenset(
    (
        "devices", "gpus", "deploy", "volumes", "privileged", "cap_add", "cap_drop", "security_opt",
        "network_mode", "pid", "ipc", "uts", "userns_mode", "cgroup", "cgroup_parent",
        "device_cgroup_rules", "runtime", "isolation", "ports", "sysctls", "tmpfs", "ulimits",
        "pids_limit", "oom_kill_disable", "oom_score_adj", "storage_opt", "annotations", "logging",
    )
)  # fmt: skip
_VARIABLE = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


def _interpolate(text: str, env: Mapping[str, str]) -> str:
    """`${VAR}`, `${VAR:-default}`, `${VAR-default}` and `$VAR` as Compose reads them ($$ is a $)."""

    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        found = env.get(name)
        operator, default = match.group(2), match.group(3) or ""
        if operator in (":-", ":?") and not found:
            return default if operator == ":-" else ""
        if operator in ("-", "?") and found is None:
            return default if operator == "-" else ""
        return found or ""

    return _VARIABLE.sub(value, text)


def _walk(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return _interpolate(node, env)
    if isinstance(node, list):
        return [_walk(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _walk(value, env) for key, value in node.items()}
    return node


def _dotenv(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            key, eq, value = line.strip().partition("=")
            if eq and not key.startswith("#"):
                found[key.strip()] = value.strip().strip("'\"")
    return found


def project_name(text: str) -> str:
    """A project name as Compose normalises it: lower case, only [a-z0-9_-]."""
    return re.sub(r"[^a-z0-9_-]", "", text.lower())


def _mapping(value: Any) -> dict[str, str]:
    """A Compose list (`KEY=VALUE`) or mapping, as a mapping of strings."""
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v) for k, v in value.items()}
    if isinstance(value, list):
        return {k: v for k, _, v in (str(item).partition("=") for item in value)}
    return {}


def _device_request(entry: Mapping[str, Any]) -> dict[str, Any]:
    """`deploy.resources.reservations.devices[]` or `gpus[]` as a device request."""
    count = entry.get("count")
    ids = entry.get("device_ids")
    caps = entry.get("capabilities") or []
    return {
        "Driver": str(entry.get("driver") or ""),
        "Count": -1 if count == "all" else int(count) if count is not None else 0,
        "DeviceIDs": [str(i) for i in ids] if ids is not None else None,
        "Capabilities": [[str(c) for c in caps]] if caps else None,
        "Options": _mapping(entry.get("options")) or None,
    }


def _devices(specs: list[Any]) -> tuple[list[dict[str, str]], list[str]]:
    """`devices:` as Devices and CDI names; the short syntax is split at ':' as Compose splits it."""
    devices, cdi = [], []
    for spec in specs:
        if isinstance(spec, dict):
            source = str(spec.get("source", ""))
            target = str(spec.get("target", source))
            spec = f"{source}:{target}:{spec.get('permissions', 'rwm')}"
        mapping = device_mapping(str(spec))
        host = mapping["PathOnHost"]
        if is_qualified_name(host) and mapping["PathInContainer"] == host:
            cdi.append(host)
        else:
            devices.append(mapping)
    return devices, cdi


def _volume_mounts(
    specs: list[Any], project: str, base: Path, named: Mapping[str, Any]
) -> tuple[list[str], list[dict[str, Any]], dict[str, Any]]:
    """`volumes:` as Binds (short bind syntax), Mounts and anonymous Volumes."""
    binds: list[str] = []
    mounts: list[dict[str, Any]] = []
    anonymous: dict[str, Any] = {}

    def absolute(path: str) -> str:
        return str((base / os.path.expanduser(path)).resolve()) if not path.startswith("/") else path

    for spec in specs:
        if isinstance(spec, str):
            source, sep, rest = spec.partition(":")
            if not sep:
                anonymous[spec] = {}
            elif source.startswith(("/", ".", "~")):
                bind, _ = bind_volume(f"{absolute(source)}:{rest}", absolute)
                binds.append(bind or "")
            else:
                target, _, mode = rest.partition(":")
                mounts.append(
                    {
                        "Type": "volume",
                        "Source": _volume_name(source, project, named),
                        "Target": target,
                        "ReadOnly": "ro" in mode.split(","),
                    }
                )
            continue
        if not isinstance(spec, dict):
            continue
        kind = str(spec.get("type", "volume"))
        mount: dict[str, Any] = {"Type": kind, "Target": str(spec.get("target", ""))}
        given = spec.get("source")
        if given:
            if kind == "bind":
                mount["Source"] = absolute(str(given))
            elif kind == "volume":
                mount["Source"] = _volume_name(str(given), project, named)
            else:
                mount["Source"] = str(given)
        if spec.get("read_only"):
            mount["ReadOnly"] = True
        bind_options = spec.get("bind") or {}
        if isinstance(bind_options, dict) and bind_options.get("propagation"):
            mount["BindOptions"] = {"Propagation": str(bind_options["propagation"])}
        volume = spec.get("volume") or {}
        if isinstance(volume, dict) and volume:
            pairs = (("NoCopy", volume.get("nocopy")), ("Subpath", volume.get("subpath")))
            mount["VolumeOptions"] = {k: v for k, v in pairs if v}
        mounts.append(mount)
    return binds, mounts, anonymous


def _volume_name(source: str, project: str, named: Mapping[str, Any]) -> str:
    defined = named.get(source)
    if isinstance(defined, dict) and defined.get("name"):
        return str(defined["name"])
    if isinstance(defined, dict) and defined.get("external"):
        return source
    return f"{project}_{source}"


def _ports(specs: list[Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    short: list[str] = []
    for spec in specs:
        if isinstance(spec, dict):
            published = spec.get("published")
            host_ip = spec.get("host_ip")
            text = f"{spec.get('target')}/{spec.get('protocol', 'tcp')}"
            if published is not None:
                text = f"{published}:{text}"
                if host_ip:
                    text = f"{host_ip}:{text}"
            short.append(text)
        else:
            short.append(str(spec))
    return port_bindings(short)


def _ulimits(value: Any) -> list[dict[str, Any]]:
    limits = []
    for name, limit in (value or {}).items():
        if isinstance(limit, dict):
            limits.append(
                {"Name": name, "Soft": int(limit.get("soft", 0)), "Hard": int(limit.get("hard", 0))}
            )
        else:
            limits.append({"Name": name, "Soft": int(limit), "Hard": int(limit)})
    return limits


def service_body(
    name: str, service: Mapping[str, Any], project: str, base: Path, named: Mapping[str, Any]
) -> dict[str, Any]:
    """The container create body Compose sends for one service."""
    for key in service:
        if key not in _FREE and key not in _CHECKED and not str(key).startswith("x-"):
            raise ValidationError(
                f"rdc repo check does not know the Compose key {key!r} (service {name})",
                "check the file without it, or run it: the gate decides every request itself",
            )
    s = service.get
    host: dict[str, Any] = {"NetworkMode": str(s("network_mode") or f"{project}_default")}
    body: dict[str, Any] = {"Image": str(s("image") or f"{project}-{name}"), "HostConfig": host}
    env = _mapping(s("environment"))
    if env:
        body["Env"] = [f"{k}={v}" for k, v in env.items()]
    devices, cdi = _devices(list(s("devices") or []))
    requests = [_device_request(g) for g in (s("gpus") or []) if isinstance(g, dict)]
    if s("gpus") == "all":
        requests.append({"Driver": "", "Count": -1, "Capabilities": [["gpu"]]})
    deploy = s("deploy") or {}
    resources = deploy.get("resources") or {} if isinstance(deploy, dict) else {}
    reserved = (resources.get("reservations") or {}).get("devices") or []
    requests += [_device_request(entry) for entry in reserved if isinstance(entry, dict)]
    put_devices(host, devices, cdi, requests)
    binds, mounts, anonymous = _volume_mounts(list(s("volumes") or []), project, base, named)
    if binds:
        host["Binds"] = binds
    if mounts:
        host["Mounts"] = mounts
    if anonymous:
        body["Volumes"] = anonymous
    exposed, bindings = _ports(list(s("ports") or []))
    if exposed:
        body["ExposedPorts"] = exposed
    if bindings:
        host["PortBindings"] = bindings
    for key, field in (("privileged", "Privileged"), ("oom_kill_disable", "OomKillDisable")):
        if s(key):
            host[field] = True
    for key, field in (("cap_add", "CapAdd"), ("cap_drop", "CapDrop"), ("security_opt", "SecurityOpt"),
                       ("device_cgroup_rules", "DeviceCgroupRules")):  # fmt: skip
        if s(key):
            host[field] = [str(v) for v in s(key) or ()]
    for key, field in (("pid", "PidMode"), ("ipc", "IpcMode"), ("uts", "UTSMode"),
                       ("userns_mode", "UsernsMode"), ("cgroup", "CgroupnsMode"),
                       ("cgroup_parent", "CgroupParent"), ("runtime", "Runtime"),
                       ("isolation", "Isolation")):  # fmt: skip
        if s(key):
            host[field] = str(s(key))
    tmpfs = s("tmpfs")
    if tmpfs:
        items = [tmpfs] if isinstance(tmpfs, str) else [str(t) for t in tmpfs]
        host["Tmpfs"] = {path: opts for path, _, opts in (t.partition(":") for t in items)}
    for key, field in (("sysctls", "Sysctls"), ("storage_opt", "StorageOpt"), ("annotations", "Annotations")):
        if s(key):
            host[field] = _mapping(s(key))
    if s("ulimits"):
        host["Ulimits"] = _ulimits(s("ulimits"))
    pids = s("pids_limit") or (resources.get("limits") or {}).get("pids")
    if pids:
        host["PidsLimit"] = int(pids)
    score = s("oom_score_adj")
    if score is not None:
        host["OomScoreAdj"] = int(score)
    logging = s("logging")
    if isinstance(logging, dict) and logging.get("driver"):
        host["LogConfig"] = {"Type": str(logging["driver"]), "Config": _mapping(logging.get("options"))}
    return body


def from_compose(path: Path, project: str | None = None) -> list[CheckedRequest]:
    """The requests `docker compose -f PATH up` sends: named volumes, networks, then each service."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(
            f"cannot read the Compose file {path}: {exc.strerror}",
            "name a Compose file that exists (rdc repo check REPO ./compose.yaml)",
        ) from exc
    base = path.resolve().parent
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValidationError(
            f"{path} is not valid YAML: {exc}", "fix the file, then check it again"
        ) from exc
    if not isinstance(document, dict) or not isinstance(document.get("services"), dict):
        raise ValidationError(f"{path} has no services", "name a Compose file with a services: section")
    env = {**_dotenv(base / ".env"), **os.environ}
    document = _walk(document, env)
    project = project_name(project or str(document.get("name") or base.name))
    named = document.get("volumes") or {}
    requests: list[CheckedRequest] = []
    for name, volume in named.items():
        volume = volume or {}
        if volume.get("external"):
            continue
        body: dict[str, Any] = {
            "Name": str(volume.get("name") or f"{project}_{name}"),
            "Driver": str(volume.get("driver") or "local"),
            "DriverOpts": _mapping(volume.get("driver_opts")),
            "Labels": {"com.docker.compose.project": project, "com.docker.compose.volume": str(name)},
        }
        requests.append(CheckedRequest(f"volume {name}", "POST", f"{API}/volumes/create", body))
    for name, network in (document.get("networks") or {}).items():
        network = network or {}
        if network.get("external"):
            continue
        body = {
            "Name": str(network.get("name") or f"{project}_{name}"),
            "Driver": str(network.get("driver") or "bridge"),
        }
        if network.get("driver_opts"):
            body["Options"] = _mapping(network["driver_opts"])
        if network.get("internal"):
            body["Internal"] = True
        ipam = network.get("ipam") or {}
        if ipam.get("config"):
            body["IPAM"] = {
                "Driver": str(ipam.get("driver") or "default"),
                "Config": [
                    {
                        key: str(entry[low])
                        for key, low in (
                            ("Subnet", "subnet"),
                            ("Gateway", "gateway"),
                            ("IPRange", "ip_range"),
                        )
                        if entry.get(low)
                    }
                    for entry in ipam["config"]
                ],
            }
        requests.append(CheckedRequest(f"network {name}", "POST", f"{API}/networks/create", body))
    for name, service in document["services"].items():
        body = service_body(str(name), service or {}, project, base, named)
        query = urlencode({"name": str((service or {}).get("container_name") or f"{project}-{name}-1")})
        requests.append(CheckedRequest(f"service {name}", "POST", f"{API}/containers/create?{query}", body))
    return requests
