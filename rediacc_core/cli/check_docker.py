"""A `docker run`/`docker create` command line as the request body the docker CLI sends for it.

For `rdc repo check`: the body is decided offline by the gate's own decider. Every option that
reaches a field the gate has a rule on (`gate/field_policy.py`) is translated as the CLI translates
it; options whose fields the gate leaves free are read and dropped; an option this module does not
know is an error, never skipped, so a check never admits what the gate would refuse.
"""

from __future__ import annotations

import csv
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from rediacc_core.cdi.names import is_qualified_name
from rediacc_core.errors import ValidationError

# The API version of the requests: the one Docker Engine 26.1's CLI speaks; the gate decides every
# version it serves the same way.
API = "/v1.45"


@dataclass(frozen=True)
class CheckedRequest:
    """One request a command would send: what it is for the user, and what the gate reads."""

    what: str  # "docker run", "service web", "volume data"
    method: str
    target: str
    body: dict[str, Any] = field(default_factory=dict)


# Options without a value.
_FLAGS = {
    "-d": "detach", "--detach": "detach", "-i": "interactive", "--interactive": "interactive",
    "-t": "tty", "--tty": "tty", "--rm": "rm", "--privileged": "privileged", "--init": "init",
    "--read-only": "read-only", "-P": "publish-all", "--publish-all": "publish-all",
    "--oom-kill-disable": "oom-kill-disable", "--no-healthcheck": "no-healthcheck",
    "-q": "quiet", "--quiet": "quiet", "--sig-proxy": "sig-proxy", "--help": "help",
    "--disable-content-trust": "disable-content-trust", "--use-api-socket": "use-api-socket",
}  # fmt: skip
_SHORT_VALUES = {
    "-v": "volume", "-e": "env", "-p": "publish", "-u": "user", "-w": "workdir", "-m": "memory",
    "-l": "label", "-h": "hostname", "-a": "attach", "-c": "cpu-shares",
}  # fmt: skip
# Options with a value that reach a field the gate checks: translated below.
_CHECKED = frozenset(
    [
        "device",
        "gpus",
        "volume",
        "mount",
        "privileged",
        "cap-add",
        "cap-drop",
        "security-opt",
        "network",
        "net",
        "pid",
        "ipc",
        "uts",
        "userns",
        "cgroupns",
        "cgroup-parent",
        "device-cgroup-rule",
        "runtime",
        "isolation",
        "publish",
        "expose",
        "env",
        "env-file",
        "tmpfs",
        "sysctl",
        "ulimit",
        "pids-limit",
        "oom-score-adj",
        "storage-opt",
        "annotation",
        "log-driver",
        "log-opt",
        "volume-driver",
        "name",
        "platform",
    ]
)
# Options with a value whose fields the gate leaves free (`field_policy.FREE`): read and dropped.
_FREE = frozenset(
    [
        "user",
        "workdir",
        "memory",
        "label",
        "label-file",
        "hostname",
        "attach",
        "cpu-shares",
        "cpus",
        "cpu-period",
        "cpu-quota",
        "cpuset-cpus",
        "cpuset-mems",
        "memory-reservation",
        "memory-swap",
        "memory-swappiness",
        "shm-size",
        "entrypoint",
        "restart",
        "dns",
        "dns-option",
        "dns-search",
        "add-host",
        "domainname",
        "group-add",
        "health-cmd",
        "health-interval",
        "health-retries",
        "health-start-period",
        "health-timeout",
        "health-start-interval",
        "link",
        "mac-address",
        "ip",
        "ip6",
        "network-alias",
        "link-local-ip",
        "stop-signal",
        "stop-timeout",
        "volumes-from",
        "pull",
        "cidfile",
        "detach-keys",
        "blkio-weight",
        "blkio-weight-device",
        "device-read-bps",
        "device-write-bps",
        "device-read-iops",
        "device-write-iops",
        "kernel-memory",
        "cpu-rt-period",
        "cpu-rt-runtime",
    ]
)


def _unknown(option: str) -> ValidationError:
    return ValidationError(
        f"rdc repo check does not know the docker run option {option}, so it cannot say what the gate "
        "would decide",
        "check the command line without it, or run it: the gate decides every request itself",
    )


def _value_for(option: str, args: Sequence[str], i: int) -> str:
    """The value an option takes from the next argument, which must be there."""
    if i >= len(args):
        raise ValidationError(f"docker run option {option} needs a value", f"give it one: {option} VALUE")
    return args[i]


def parse_run(argv: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The options of a `docker run` argument list (each name's values, flags as "true"/"false"),
    and what follows them: the image and its command."""
    options: dict[str, list[str]] = {}
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return options, args[i + 1 :] if arg == "--" else args[i:]
        name, eq, value = arg.partition("=")
        if name in _FLAGS:
            options.setdefault(_FLAGS[name], []).append(value if eq else "true")
        elif name.startswith("--"):
            key = name[2:]
            if key not in _CHECKED and key not in _FREE:
                raise _unknown(name)
            if not eq:
                i += 1
                value = _value_for(name, args, i)
            options.setdefault(key, []).append(value)
        else:
            # One or more short flags together (-it), the last of which may take a value (-itv X).
            letters = arg[1:]
            for n, letter in enumerate(letters):
                short = f"-{letter}"
                if short in _FLAGS:
                    options.setdefault(_FLAGS[short], []).append("true")
                    continue
                if short not in _SHORT_VALUES:
                    raise _unknown(short)
                rest = letters[n + 1 :].removeprefix("=")
                if not rest:
                    i += 1
                    rest = _value_for(short, args, i)
                options.setdefault(_SHORT_VALUES[short], []).append(rest)
                break
        i += 1
    return options, []


def _true(values: list[str] | None) -> bool:
    return values is not None and bool(values) and values[-1].lower() not in ("false", "0")


def device_mapping(spec: str) -> dict[str, str]:
    """`--device HOST[:CONTAINER][:PERMISSIONS]` as the CLI's DeviceMapping."""
    parts = spec.split(":")
    host, inside, perms = parts[0], parts[0], "rwm"
    if len(parts) == 2:
        if parts[1] and set(parts[1]) <= set("rwm"):
            perms = parts[1]
        else:
            inside = parts[1]
    elif len(parts) >= 3:
        inside, perms = parts[1], parts[2]
    return {"PathOnHost": host, "PathInContainer": inside, "CgroupPermissions": perms}


def gpus_request(value: str) -> dict[str, Any]:
    """`--gpus all|N|device=0,1|capabilities=…` (the CLI's GpuOpts) as a device request."""
    request: dict[str, Any] = {"Driver": "", "Count": 0, "DeviceIDs": None, "Capabilities": [["gpu"]]}
    if value == "all":
        request["Count"] = -1
        return request
    if value.isdigit():
        request["Count"] = int(value)
        return request
    for item in next(csv.reader([value])):
        key, _, val = item.partition("=")
        if key == "device":
            request["DeviceIDs"] = val.split(",")
        elif key == "count":
            request["Count"] = -1 if val == "all" else int(val) if val.isdigit() else 0
        elif key == "driver":
            request["Driver"] = val
        elif key == "capabilities":
            request["Capabilities"] = [["gpu", *val.split(",")]]
        elif item == "all":
            request["Count"] = -1
        elif item.isdigit():
            request["Count"] = int(item)
        else:
            raise ValidationError(
                f"rdc repo check does not know the --gpus item {item!r}", "check the command without it"
            )
    return request


def mount_spec(spec: str) -> dict[str, Any]:
    """`--mount type=…,source=…,target=…[,…]` as the API's Mount."""
    mount: dict[str, Any] = {"Type": "volume"}
    volume_options: dict[str, Any] = {}
    driver_options: dict[str, str] = {}
    for item in next(csv.reader([spec])):
        key, eq, val = item.partition("=")
        key = key.lower()
        if key == "type":
            mount["Type"] = val
        elif key in ("source", "src"):
            mount["Source"] = val
        elif key in ("target", "dst", "destination"):
            mount["Target"] = val
        elif key in ("readonly", "ro"):
            mount["ReadOnly"] = not eq or val.lower() in ("1", "true")
        elif key == "bind-propagation":
            mount.setdefault("BindOptions", {})["Propagation"] = val
        elif key == "bind-recursive":
            mount.setdefault("BindOptions", {})[
                "ReadOnlyNonRecursive" if val == "writable" else "NonRecursive"
            ] = val in ("disabled", "writable")
        elif key == "volume-driver":
            volume_options["DriverConfig"] = {"Name": val}
        elif key == "volume-label":
            name, _, label = val.partition("=")
            volume_options.setdefault("Labels", {})[name] = label
        elif key == "bind-nonrecursive":
            mount.setdefault("BindOptions", {})["NonRecursive"] = not eq or val.lower() in ("1", "true")
        elif key == "bind-create-mountpoint":
            mount.setdefault("BindOptions", {})["CreateMountpoint"] = not eq or val.lower() in ("1", "true")
        elif key == "image-subpath":
            mount.setdefault("ImageOptions", {})["Subpath"] = val
        elif key == "volume-opt":
            name, _, option = val.partition("=")
            driver_options[name] = option
        elif key == "volume-nocopy":
            volume_options["NoCopy"] = not eq or val.lower() in ("1", "true")
        elif key == "volume-subpath":
            volume_options["Subpath"] = val
        elif key == "tmpfs-size":
            mount.setdefault("TmpfsOptions", {})["SizeBytes"] = _bytes(val)
        elif key == "tmpfs-mode":
            mount.setdefault("TmpfsOptions", {})["Mode"] = int(val, 8)
        elif key != "consistency":
            raise ValidationError(
                f"rdc repo check does not know the --mount key {key!r}", "check the command without it"
            )
    if driver_options:
        volume_options.setdefault("DriverConfig", {})["Options"] = driver_options
    if volume_options:
        mount["VolumeOptions"] = volume_options
    return mount


def _bytes(text: str) -> int:
    units = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    text = text.strip().lower().removesuffix("b") or "0"
    if text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def port_bindings(specs: Sequence[str], exposed: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """`-p [IP:][HOST:]CONTAINER[/PROTO]` (and `--expose`) as ExposedPorts and PortBindings."""
    exposed_ports: dict[str, Any] = {}
    bindings: dict[str, list[dict[str, str]]] = {}
    for spec in exposed:
        port, _, proto = spec.partition("/")
        exposed_ports[f"{port}/{proto or 'tcp'}"] = {}
    for spec in specs:
        if "=" in spec:
            spec = _long_port(spec)
        spec, _, proto = spec.partition("/")
        host_ip = ""
        if spec.startswith("["):  # an IPv6 address
            close = spec.index("]")
            host_ip, spec = spec[1:close], spec[close + 2 :]
        parts = spec.split(":")
        if len(parts) == 3:
            host_ip = host_ip or parts[0]
            parts = parts[1:]
        host, inside = (parts[0], parts[1]) if len(parts) == 2 else ("", parts[0])
        inner = inside.split("-")
        outer = host.split("-") if host else [""] * len(inner)
        if len(inner) == 2:
            inner = [str(p) for p in range(int(inner[0]), int(inner[1]) + 1)]
            if len(outer) == 2:
                outer = [str(p) for p in range(int(outer[0]), int(outer[1]) + 1)]
        if len(outer) != len(inner):
            outer = [host] * len(inner)
        for container_port, host_port in zip(inner, outer, strict=True):
            key = f"{container_port}/{proto or 'tcp'}"
            exposed_ports[key] = {}
            bindings.setdefault(key, []).append({"HostIp": host_ip, "HostPort": host_port})
    return exposed_ports, bindings


def _long_port(spec: str) -> str:
    """`--publish mode=…,target=…,published=…,protocol=…` (the CLI's long form) as the short form."""
    keys: dict[str, str] = {}
    for item in next(csv.reader([spec])):
        key, _, val = item.partition("=")
        if key not in ("mode", "target", "published", "protocol"):
            raise ValidationError(
                f"rdc repo check does not know the --publish key {key!r}", "check the command without it"
            )
        keys[key] = val
    if not keys.get("target"):
        raise ValidationError(f"--publish {spec} names no target port", "add target=PORT")
    short = f"{keys['target']}/{keys.get('protocol') or 'tcp'}"
    return f"{keys['published']}:{short}" if keys.get("published") else short


def _pairs(values: Sequence[str]) -> dict[str, str]:
    return {k: v for k, _, v in (value.partition("=") for value in values)}


def _env_file(path: str) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValidationError(
            f"cannot read the --env-file {path}: {exc.strerror}", "name a file that exists"
        ) from exc
    found = []
    for line in lines:
        line = line.strip()
        if line and not line.startswith("#"):
            found.append(line if "=" in line else f"{line}={os.environ.get(line, '')}")
    return found


def _ulimit(spec: str) -> dict[str, Any]:
    name, _, limits = spec.partition("=")
    soft, _, hard = limits.partition(":")
    return {"Name": name, "Soft": int(soft), "Hard": int(hard or soft)}


def bind_volume(spec: str, resolve: Callable[[str], str] = os.path.abspath) -> tuple[str | None, str | None]:
    """`-v SRC:DST[:OPTS]` or `-v DST`: the bind (relative sources made absolute) or the anonymous
    volume it is."""
    host, sep, rest = spec.partition(":")
    if not sep:
        return None, spec
    if host.startswith("."):
        host = resolve(host)
    return f"{host}:{rest}", None


def put_devices(
    host: dict[str, Any], devices: list[dict[str, str]], cdi: list[str], requests: list[dict[str, Any]]
) -> None:
    """Devices into a create body's HostConfig as the CLI puts them: CDI names as one `cdi` request
    after the others (`--gpus`), each field only when it has something."""
    if cdi:
        requests.append({"Driver": "cdi", "DeviceIDs": cdi})
    if devices:
        host["Devices"] = devices
    if requests:
        host["DeviceRequests"] = requests


def create_body(options: dict[str, list[str]], rest: Sequence[str]) -> dict[str, Any]:
    """The container create body of `docker run` options and `IMAGE [COMMAND…]`."""
    if not rest:
        raise ValidationError(
            "the docker run command line names no image", "end it with the image (and its command)"
        )
    o = options.get
    host: dict[str, Any] = {}
    body: dict[str, Any] = {"Image": rest[0], "HostConfig": host}
    if len(rest) > 1:
        body["Cmd"] = list(rest[1:])
    env = [e for f in o("env-file", []) for e in _env_file(f)]
    env += [e if "=" in e else f"{e}={os.environ.get(e, '')}" for e in o("env", [])]
    if env:
        body["Env"] = env
    devices, cdi = [], []
    for spec in o("device", []):
        if is_qualified_name(spec):  # CLI 25+: a CDI name is a CDI device request
            cdi.append(spec)
        else:
            devices.append(device_mapping(spec))
    put_devices(host, devices, cdi, [gpus_request(v) for v in o("gpus", [])])
    binds: list[str] = []
    volumes: dict[str, Any] = {}
    for spec in o("volume", []):
        bind, anonymous = bind_volume(spec)
        if bind:
            binds.append(bind)
        elif anonymous:
            volumes[anonymous] = {}
    if binds:
        host["Binds"] = binds
    if volumes:
        body["Volumes"] = volumes
    if o("mount"):
        host["Mounts"] = [mount_spec(spec) for spec in o("mount", [])]
    exposed, bindings = port_bindings(o("publish", []), o("expose", []))
    if exposed:
        body["ExposedPorts"] = exposed
    if bindings:
        host["PortBindings"] = bindings
    if _true(o("publish-all")):
        host["PublishAllPorts"] = True
    if _true(o("privileged")):
        host["Privileged"] = True
    if _true(o("oom-kill-disable")):
        host["OomKillDisable"] = True
    for option, key in (("cap-add", "CapAdd"), ("cap-drop", "CapDrop"), ("security-opt", "SecurityOpt"),
                        ("device-cgroup-rule", "DeviceCgroupRules")):  # fmt: skip
        if o(option):
            host[key] = list(o(option, []))
    network = o("network") or o("net")
    for key, values in (
        ("NetworkMode", network), ("PidMode", o("pid")), ("IpcMode", o("ipc")),
        ("UTSMode", o("uts")), ("UsernsMode", o("userns")),
        ("CgroupnsMode", o("cgroupns")), ("CgroupParent", o("cgroup-parent")),
        ("Runtime", o("runtime")), ("Isolation", o("isolation")),
        ("VolumeDriver", o("volume-driver")),
    ):  # fmt: skip
        if values:
            host[key] = values[-1]
    if o("tmpfs"):
        host["Tmpfs"] = {path: opts for path, _, opts in (t.partition(":") for t in o("tmpfs", []))}
    if o("sysctl"):
        host["Sysctls"] = _pairs(o("sysctl", []))
    if o("storage-opt"):
        host["StorageOpt"] = _pairs(o("storage-opt", []))
    if o("annotation"):
        host["Annotations"] = _pairs(o("annotation", []))
    if o("ulimit"):
        host["Ulimits"] = [_ulimit(u) for u in o("ulimit", [])]
    if o("pids-limit"):
        host["PidsLimit"] = int(o("pids-limit", ["0"])[-1])
    if o("oom-score-adj"):
        host["OomScoreAdj"] = int(o("oom-score-adj", ["0"])[-1])
    if o("log-driver") or o("log-opt"):
        host["LogConfig"] = {"Type": (o("log-driver") or [""])[-1], "Config": _pairs(o("log-opt", []))}
    return body


def from_docker(argv: Sequence[str]) -> list[CheckedRequest]:
    """The requests of `docker run|create …` (also `docker container run|create …`)."""
    args = list(argv)
    if args[:1] != ["docker"]:
        raise ValidationError(
            f"rdc repo check reads docker and docker compose command lines only, not {shlex.join(args[:1])}",
            "write it as: rdc repo check REPO -- docker run [OPTIONS] IMAGE [COMMAND]",
        )
    args = args[1:]
    if args[:1] == ["container"]:
        args = args[1:]
    if not args or args[0] not in ("run", "create"):
        shown = shlex.join(["docker", *args[:1]])
        raise ValidationError(
            f"rdc repo check reads docker run and docker create command lines, not {shown}",
            "write it as: rdc repo check REPO -- docker run [OPTIONS] IMAGE [COMMAND], "
            "or name a Compose file: rdc repo check REPO compose.yaml",
        )
    options, rest = parse_run(args[1:])
    params = [(key, options[key][-1]) for key in ("name", "platform") if options.get(key)]
    query = f"?{urlencode(params)}" if params else ""
    what = f"docker {args[0]}"
    return [CheckedRequest(what, "POST", f"{API}/containers/create{query}", create_body(options, rest))]
