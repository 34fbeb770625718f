"""The core's own request rules: every vendor-neutral way of reaching host hardware, refused.

Each finding names what was refused and the CDI form to use instead. Vendor plugins know better
replacements for their own devices (`/dev/<node>` -> the exact CDI name); they answer with a
`Refusal` carrying the same `rule` id, and the decider lets theirs replace the core's.

Capabilities: `ALL`, `SYS_ADMIN` (remounts and cgroup writes get past the device cgroup),
`SYS_RAWIO` (I/O ports and raw memory: hardware without any device node) and `SYS_MODULE` (a kernel
module ends every policy) are refused. `MKNOD` is in Docker's default set and harmless alone: the
device cgroup still denies opening a node, and the rules that would widen that cgroup
(`DeviceCgroupRules`, `Privileged`) are refused. `group_add` of any group is accepted: a group grants
no access to a device node the container was not given.

Rule ids (a plugin refusal with one of these replaces the core's finding about the same value):
`privileged`, `device-cgroup-rules`, `raw-device`, `device-request-driver`, `runtime`, `dev-mount`,
`volume-device`, `cdi-annotation`, `cdi-name-split`, `capability`, `plugin-privilege`, `plugin-create`,
`swarm-generic-resources`; the decider adds `grant` for names the repo was not granted.
"""

from __future__ import annotations

import os
import posixpath
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rediacc_core import hostpaths
from rediacc_core.cdi.names import is_qualified_name
from rediacc_core.machine import Machine
from rediacc_core.model import Refusal

CDI_DEVICE = "--device <vendor>/<class>=<name> (`rdc machine gpu list` shows the names)"
COMPOSE_DEVICES = (
    "devices: [<vendor>/<class>=<name>] in Compose, --device <vendor>/<class>=<name> with docker run"
)
REFUSED_CAPABILITIES = frozenset({"ALL", "SYS_ADMIN", "SYS_RAWIO", "SYS_MODULE"})
ALLOWED_RUNTIMES = frozenset({"", "runc"})
DEVICE_PRIVILEGES = frozenset({"device", "devices", "allow-all-devices"})
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"


@dataclass(frozen=True)
class Finding:
    """A refusal plus the value it is about, so a plugin's refusal of that value can replace it."""

    refusal: Refusal
    subject: str


def _grant_hint(repo_ref: str) -> str:
    return f"a CDI grant: rdc repo gpu grant {repo_ref} --device <vendor>/<class>=<name>"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- paths on the machine --------------------------------------------------------------------


HARDWARE_ROOTS = ("/dev", "/sys")


class MachinePaths:
    """Resolves paths as the machine's kernel would (symlinks inside the machine root) to find /dev."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine

    def resolve(self, path: str) -> str | None:
        return hostpaths.resolve(self.machine, path)

    def dev_roots(self) -> dict[str, str]:
        """Every path that reaches host hardware, mapped to the name it is reported by.

        /dev holds the device nodes; /sys holds the PCI config and resource files that map a card's
        registers, so a writable bind of either hands the hardware over without any grant.
        """
        roots: dict[str, str] = {}
        for top in HARDWARE_ROOTS:
            roots[top] = top
            real = self.resolve(top)
            if real is not None:
                roots.setdefault(real, top)
        return roots

    def reaches_devices(self, source: str) -> str | None:
        """Why binding `source` would expose host devices, or None when it would not."""
        text = source if source.startswith("/") else "/" + source
        candidates = {self.resolve(text), self.resolve(posixpath.normpath(text))}
        roots = self.dev_roots()
        for resolved in candidates:
            if resolved is None:
                return "its symlinks loop"
            for root, shown in roots.items():
                if resolved == root or resolved.startswith(root + "/"):
                    return (
                        f"it resolves to {resolved}, under {shown}"
                        if resolved != text
                        else f"it is under {shown}"
                    )
                if resolved == "/" or root.startswith(resolved + "/"):
                    return f"it resolves to {resolved}, which contains {shown}"
            try:
                mode = os.stat(self.machine.path(resolved)).st_mode
            except OSError:
                continue
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                return f"{resolved} is a device node"
        return None


# --- the Compose fold and the CDI names a request asks for ------------------------------------


def fold_compose_devices(body: dict[str, Any], container: str = "HostConfig") -> list[str]:
    """Move `Devices` entries whose host path is a CDI name into the CDI device request.

    Compose before 2.30 sends `devices: [vendor/class=name]` that way; the daemon would refuse it.
    Returns the names moved. `container` is where Devices live ("" for an update body).
    """
    holder = _dict(body.get(container)) if container else body
    devices = holder.get("Devices")
    if not isinstance(devices, list):
        return []
    names: list[str] = []
    kept: list[Any] = []
    for entry in devices:
        host = _dict(entry).get("PathOnHost")
        inside = _dict(entry).get("PathInContainer") or ""
        # Compose's short syntax splits at ':', so `vendor/class=0:1` arrives as host
        # `vendor/class=0`, container `1`: folding that would ask for another device. Left in
        # Devices, it is refused as `cdi-name-split`.
        if isinstance(host, str) and is_qualified_name(host) and inside in ("", host):
            names.append(host)
        else:
            kept.append(entry)
    if names:
        holder["Devices"] = kept
        add_cdi_devices(holder, names)
    return names


def add_cdi_devices(holder: dict[str, Any], names: list[str] | tuple[str, ...]) -> None:
    """Add `names` to the first CDI device request in `holder` (creating one), without repeats."""
    requests = holder.get("DeviceRequests")
    if not isinstance(requests, list):
        requests = []
        holder["DeviceRequests"] = requests
    target = next((r for r in requests if isinstance(r, dict) and r.get("Driver") == "cdi"), None)
    if target is None:
        target = {"Driver": "cdi", "DeviceIDs": []}
        requests.append(target)
    ids = target.get("DeviceIDs")
    if not isinstance(ids, list):
        ids = []
        target["DeviceIDs"] = ids
    ids.extend(name for name in dict.fromkeys(names) if name not in ids)


def cdi_devices(holder: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every device id in `holder`'s CDI device requests, in order, once each."""
    names: list[str] = []
    for request in _list(_dict(holder).get("DeviceRequests")):
        request = _dict(request)
        if request.get("Driver") == "cdi":
            names.extend(i for i in _list(request.get("DeviceIDs")) if isinstance(i, str))
    return tuple(dict.fromkeys(names))


# --- the rules -------------------------------------------------------------------------------


def _refuse(rule: str, subject: str, message: str, replacement: str | None) -> Finding:
    return Finding(Refusal(message=message, replacement=replacement, rule=rule), subject)


def _resources(res: Mapping[str, Any], repo_ref: str) -> Iterator[Finding]:
    """Rules for the device fields of a Resources struct (HostConfig, or an update body)."""
    rules = [r for r in _list(res.get("DeviceCgroupRules")) if r]
    if rules:
        yield _refuse(
            "device-cgroup-rules",
            ", ".join(rules),
            f"device cgroup rules are refused ({', '.join(rules)})",
            _grant_hint(repo_ref),
        )
    for entry in _list(res.get("Devices")):
        host = _dict(entry).get("PathOnHost") or ""
        if is_qualified_name(host):
            inside = _dict(entry).get("PathInContainer") or ""
            yield _refuse(
                "cdi-name-split",
                host,
                f"device {host}:{inside} looks like a CDI name split at ':' by Compose's short syntax",
                "a device name without ':' (such as the UUID form), or Compose 2.30 or later",
            )
            continue
        yield _refuse("raw-device", host, f"raw device {host or '(empty path)'} is refused", CDI_DEVICE)
    for request in _list(res.get("DeviceRequests")):
        request = _dict(request)
        driver = request.get("Driver") or ""
        if driver == "cdi":
            continue
        caps = [c for group in _list(request.get("Capabilities")) for c in _list(group)]
        what = "--gpus" if "gpu" in caps and not driver else f"a device request with driver {driver!r}"
        yield _refuse(
            "device-request-driver",
            driver or what,
            f'{what} is refused: only CDI device requests (driver "cdi") pass the gate',
            CDI_DEVICE,
        )


def _capabilities(caps: Any, field: str) -> Iterator[Finding]:
    for cap in _list(caps):
        if not isinstance(cap, str):
            continue
        name = cap.upper().removeprefix("CAP_")
        if name in REFUSED_CAPABILITIES:
            yield _refuse(
                "capability",
                cap,
                f"{field} {cap} is refused: it reaches hardware around the device rules",
                None,
            )


def _mounts(mounts: Any, paths: MachinePaths, field: str) -> Iterator[Finding]:
    for mount in _list(mounts):
        mount = _dict(mount)
        kind = mount.get("Type")
        source = mount.get("Source") or ""
        if kind == "bind" or (kind != "volume" and source.startswith("/")):
            why = paths.reaches_devices(source)
            if why:
                yield _refuse("dev-mount", source, f"{field} of {source} is refused: {why}", CDI_DEVICE)
        options = _dict(_dict(_dict(mount.get("VolumeOptions")).get("DriverConfig")).get("Options"))
        yield from _volume_options(options, paths, f"{field} volume {source or '(anonymous)'}")


def _volume_options(options: Mapping[str, Any], paths: MachinePaths, what: str) -> Iterator[Finding]:
    """A local volume's `device` option is mounted on the host: refuse one under /dev."""
    device = options.get("device")
    if not isinstance(device, str) or not device:
        return
    head = device.split("/", 1)[0]
    if ":" in head:  # a remote source such as `server:/export`
        return
    why = paths.reaches_devices(device)
    if why:
        yield _refuse(
            "volume-device", device, f"{what} with option device={device} is refused: {why}", CDI_DEVICE
        )


def _binds(binds: Any, paths: MachinePaths) -> Iterator[Finding]:
    for bind in _list(binds):
        if not isinstance(bind, str):
            continue
        source = bind.split(":", 1)[0]
        if not source.startswith("/") or ":" not in bind:
            continue  # a named volume, or an anonymous volume's target
        why = paths.reaches_devices(source)
        if why:
            yield _refuse("dev-mount", source, f"bind of {source} is refused: {why}", CDI_DEVICE)


def _privileges(privileges: Any, paths: MachinePaths) -> Iterator[Finding]:
    for privilege in _list(privileges):
        privilege = _dict(privilege)
        name = str(privilege.get("Name") or "")
        values = [v for v in _list(privilege.get("Value")) if isinstance(v, str)]
        if name.lower() in DEVICE_PRIVILEGES:
            yield _refuse(
                "plugin-privilege",
                name,
                f"plugin privilege {name} ({', '.join(values) or 'any device'}) is refused",
                "a plugin that needs no device access; containers get devices with " + CDI_DEVICE,
            )
        elif name.lower() == "mount":
            for value in values:
                why = paths.reaches_devices(value)
                if why:
                    yield _refuse(
                        "plugin-privilege",
                        value,
                        f"plugin privilege mount {value} is refused: {why}",
                        CDI_DEVICE,
                    )


def container_create(body: Mapping[str, Any], paths: MachinePaths, repo_ref: str) -> Iterator[Finding]:
    host = _dict(body.get("HostConfig"))
    if host.get("Privileged") is True:
        yield _refuse("privileged", "Privileged", "privileged containers are refused", CDI_DEVICE)
    yield from _resources(host, repo_ref)
    runtime = host.get("Runtime") or ""
    if runtime not in ALLOWED_RUNTIMES:
        yield _refuse(
            "runtime",
            runtime,
            f"runtime {runtime!r} is refused: containers here run with runc",
            COMPOSE_DEVICES,
        )
    yield from _binds(host.get("Binds"), paths)
    yield from _mounts(host.get("Mounts"), paths, "mount")
    for key in _dict(host.get("Annotations")):
        if key.lower().startswith(CDI_ANNOTATION_PREFIX):
            yield _refuse(
                "cdi-annotation",
                key,
                f"annotation {key} is refused: it would request CDI devices",
                CDI_DEVICE,
            )
    yield from _capabilities(host.get("CapAdd"), "capability")


def container_update(body: Mapping[str, Any], repo_ref: str) -> Iterator[Finding]:
    yield from _resources(body, repo_ref)


def exec_create(body: Mapping[str, Any]) -> Iterator[Finding]:
    if body.get("Privileged") is True:
        yield _refuse(
            "privileged",
            "Privileged",
            "privileged exec is refused",
            "exec without --privileged; devices come from " + CDI_DEVICE,
        )


def volume_create(body: Mapping[str, Any], paths: MachinePaths) -> Iterator[Finding]:
    name = body.get("Name") or "(unnamed)"
    yield from _volume_options(_dict(body.get("DriverOpts")), paths, f"volume {name}")


def plugin_set(body: Any, paths: MachinePaths) -> Iterator[Finding]:
    for setting in _list(body):
        if not isinstance(setting, str) or "=" not in setting:
            continue
        key, _, value = setting.partition("=")
        if value.startswith("/"):
            why = paths.reaches_devices(value)
            if why:
                yield _refuse(
                    "plugin-privilege", value, f"plugin setting {key}={value} is refused: {why}", CDI_DEVICE
                )


def service_spec(body: Mapping[str, Any], paths: MachinePaths) -> Iterator[Finding]:
    task = _dict(body.get("TaskTemplate"))
    spec = _dict(task.get("ContainerSpec"))
    yield from _mounts(spec.get("Mounts"), paths, "service mount")
    yield from _capabilities(spec.get("CapabilityAdd"), "service capability")
    generic = _list(_dict(_dict(task.get("Resources")).get("Reservations")).get("GenericResources"))
    if generic:
        yield _refuse(
            "swarm-generic-resources",
            "GenericResources",
            "swarm generic resources are refused: they are not CDI grants",
            "a container in this repo with " + CDI_DEVICE,
        )
    yield from _privileges(_dict(task.get("PluginSpec")).get("Privileges"), paths)


def check(endpoint: str, body: Any, machine: Machine, repo_ref: str) -> list[Finding]:
    """Every core finding for a canonical `body` of `endpoint` (see `decode_fields.ROUTES`)."""
    paths = MachinePaths(machine)
    if endpoint == "plugin-create":
        return [
            _refuse(
                "plugin-create",
                "plugin",
                "creating a plugin from a local root filesystem is refused: its privileges are never shown",
                "docker plugin install from a registry, which lists the privileges the plugin asks for",
            )
        ]
    if endpoint in ("plugin-pull", "plugin-upgrade"):
        return list(_privileges(body, paths))
    if endpoint == "plugin-set":
        return list(plugin_set(body, paths))
    if not isinstance(body, dict):
        return []
    if endpoint == "container-create":
        return list(container_create(body, paths, repo_ref))
    if endpoint == "container-update":
        return list(container_update(body, repo_ref))
    if endpoint == "exec-create":
        return list(exec_create(body))
    if endpoint == "volume-create":
        return list(volume_create(body, paths))
    if endpoint in ("service-create", "service-update"):
        return list(service_spec(body, paths))
    return []
