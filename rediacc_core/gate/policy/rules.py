"""The core's request rules: the hardware rules here, and each route's rule (`Rule`, the field
`rule` of its record in `endpoints.ROUTES`), which calls the rules of the other rooms it needs.

Hardware: every vendor-neutral way of reaching a device is refused (Privileged, raw Devices, device
cgroup rules, non-CDI device requests, other runtimes, CDI annotations), each finding naming the CDI
form to use instead. Vendor plugins know better replacements for their own devices (`/dev/<node>` ->
the exact CDI name); they answer with a `Refusal` carrying the same `rule` id and `subject` (the
value refused), and the decider lets theirs replace the core's (`decision.merge_refusals`). Mounts
(`mounts.py`) and namespaces, capabilities and security options (`isolation.py`) have their own rooms;
`field_policy.py` says which rule governs each request field.

Rule ids (a plugin refusal with one of these and the same subject replaces the core's finding):
`privileged`, `device-cgroup-rules`, `raw-device`, `device-request-driver`, `runtime`, `dev-mount`,
`cdi-annotation`, `annotation`, `cdi-name-split`, `capability`, `bind-root`, `volume-driver`,
`volume-type`, `volume-subpath`, `mount-type`, `tmpfs-option`, `namespace`, `security-opt`,
`masked-paths`, `sysctl`, `cgroup-parent`, `oom`, `pids-limit`, `ulimit`, `isolation`, `log-driver`,
`storage-opt`, `network-driver`, `network-option`, `network-subnet`, `mount-propagation`,
`build-option`, `git-remote`, `fetch-address`, `swarm`, `publish-port`; the decider adds `grant` for
names the repo was not granted, `gpu-health` for a start holding a GPU its driver reported unhealthy
`endpoint` for routes it refuses whole and `stale-facts` for device requests while the CDI specs
are newer than the machine's inventory. Below the rules, the
exchange answers `bad-request` (a body it cannot read), `limit` (past a size or rate bound),
`upstream` (the daemon's answer could not be relayed) and `gate` (the gate could not decide: a bug,
refused rather than let through).

Some rules also write defaults into the canonical body the gate forwards (`limits.py`: the PIDs
limit; `isolation.py`: a private cgroup namespace for old API versions), so what the daemon reads
holds them whatever the request left out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rediacc_core.cdi.names import is_qualified_name
from rediacc_core.gate.policy import fetches, isolation, limits, mounts, publish
from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.policy.mounts import BindPolicy
from rediacc_core.gate.wire.decode import BadRequest, Target
from rediacc_core.gate.wire.devicerequests import cdi_names

CDI_DEVICE = "--device <vendor>/<class>=<name> (`rdc machine gpu list` shows the names)"
COMPOSE_DEVICES = (
    "devices: [<vendor>/<class>=<name>] in Compose, --device <vendor>/<class>=<name> with docker run"
)
# The name each repo daemon knows its default runtime by, the runtime guard (`runtime.guard`; written
# into its daemon.json by `runtime.daemon`). Naming any other runtime, even "runc", would run the
# container without the guard's check of its devices at every start.
GUARD_RUNTIME = "rediacc"
ALLOWED_RUNTIMES = frozenset({"", GUARD_RUNTIME})
RULE_IDS = frozenset(
    {
        "privileged", "device-cgroup-rules", "raw-device", "device-request-driver", "runtime", "dev-mount",
        "cdi-annotation", "cdi-name-split", "capability", "bind-root", "volume-driver", "volume-type",
        "volume-subpath", "mount-type", "tmpfs-option", "namespace", "security-opt", "masked-paths",
        "sysctl", "cgroup-parent", "oom", "isolation", "log-driver", "storage-opt", "network-driver",
        "network-option", "network-subnet", "mount-propagation", "build-option", "swarm", "grant", "endpoint",
        "annotation", "pids-limit", "ulimit", "git-remote", "fetch-address", "publish-port", "gpu-health",
        "stale-facts",
    }
)  # fmt: skip
# Ids of the exchange below the rules: the audit trail and the metrics count these too.
PROTOCOL_RULE_IDS = frozenset({"bad-request", "limit", "upstream", "gate"})
ALL_RULE_IDS = RULE_IDS | PROTOCOL_RULE_IDS
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
# Annotations reach the OCI spec, where runtimes act on them: runc on `org.systemd.property.*`
# (properties of the container's systemd scope, `Slice=` and `DevicePolicy=` among them, under the
# systemd cgroup driver) and `org.criu.*`, crun on `run.oci.*`, CDI on `cdi.k8s.io/*`, and other
# runtimes and runtime hooks on prefixes of their own. Only the OCI image annotations, metadata
# that no runtime acts on, pass; labels are the place for anything else.
SAFE_ANNOTATION_PREFIXES = ("org.opencontainers.image.",)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


# --- the Compose fold and the CDI names a request asks for ------------------------------------


def fold_compose_devices(body: dict[str, Any], container: str = "HostConfig") -> list[str]:
    """Move `Devices` entries whose host path is a CDI name into the CDI device request.

    Compose before 2.30 sends `devices: [vendor/class=name]` that way; the daemon would refuse it.
    (Every Compose splits the short syntax at ':', so a name with ':' arrives split: see
    `_device_fields`.)
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
    return cdi_names(holder)


# --- the rules -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleContext:
    """What the core rules need besides the body: who asks, and what the machine allows."""

    repo_ref: str
    binds: BindPolicy
    extra_capabilities: frozenset[str] = frozenset()
    query: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    api_version: tuple[int, int] | None = None  # None: the daemon's own (the newest)
    pids_limit: int = limits.DEFAULT_PIDS_LIMIT  # the machine's `pids-limit`
    registries: fetches.Allowed = frozenset()  # the machine's `registries`
    hard_limits: Mapping[str, int] = field(default_factory=limits.own_hard_limits)
    name: str = ""  # a query route's `{name}` (the image or reference in the path)
    published: publish.Published = field(default_factory=publish.Published)
    # An image's `Config` (None when unknown): its exposed ports are what `-P` publishes.
    image_config: Callable[[str], Mapping[str, Any] | None] = lambda ref: None


def _grant_hint(repo_ref: str) -> str:
    return f"a CDI grant: rdc repo gpu grant {repo_ref} --device <vendor>/<class>=<name>"


def _device_fields(res: Mapping[str, Any], repo_ref: str) -> Iterator[Finding]:
    """Rules for the device fields of a Resources struct (HostConfig, or an update body)."""
    rules = [r for r in _list(res.get("DeviceCgroupRules")) if r]
    if rules:
        yield refuse(
            "device-cgroup-rules",
            ", ".join(rules),
            f"device cgroup rules are refused ({', '.join(rules)})",
            _grant_hint(repo_ref),
        )
    for entry in _list(res.get("Devices")):
        host = _dict(entry).get("PathOnHost") or ""
        if is_qualified_name(host):
            inside = _dict(entry).get("PathInContainer") or ""
            yield refuse(
                "cdi-name-split",
                host,
                f"device {host}:{inside} looks like a CDI name split at ':' by Compose's short syntax",
                # Every Compose splits the short syntax (2.40 too): only a name without ':' survives it.
                f"the same device's name without ':', its UUID form (`rdc machine gpu list "
                f"{repo_ref.rpartition('@')[2]}` shows both; the repo needs a grant of that name)",
            )
            continue
        yield refuse("raw-device", host, f"raw device {host or '(empty path)'} is refused", CDI_DEVICE)
    for request in _list(res.get("DeviceRequests")):
        request = _dict(request)
        driver = request.get("Driver") or ""
        if driver == "cdi":
            continue
        caps = [c for group in _list(request.get("Capabilities")) for c in _list(group)]
        what = "--gpus" if "gpu" in caps and not driver else f"a device request with driver {driver!r}"
        yield refuse(
            "device-request-driver",
            driver or "--gpus",  # the subject a vendor's refusal of the same request names
            f'{what} is refused: only CDI device requests (driver "cdi") pass the gate',
            CDI_DEVICE,
        )


def _published_ports(body: dict[str, Any], host: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    exposed = list(_dict(body.get("ExposedPorts")))
    image = body.get("Image")
    if host.get("PublishAllPorts") is True and isinstance(image, str):
        # `-P` publishes the image's exposed ports too; the start check sees them merged, exactly.
        exposed += list(_dict(_dict(ctx.image_config(image)).get("ExposedPorts")))
    found, problems = publish.bindings(host, dict.fromkeys(exposed))
    yield from problems
    yield from publish.check(found, ctx.published, ctx.repo_ref.rpartition("@")[2])


def container_create(body: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    endpoints = _dict(_dict(body.get("NetworkingConfig")).get("EndpointsConfig"))
    yield from isolation.endpoint_sysctls(endpoints, "NetworkingConfig.EndpointsConfig.")
    if "host" in endpoints:
        yield refuse(
            "namespace",
            "EndpointsConfig.host",
            "NetworkingConfig.EndpointsConfig.host is refused: "
            "the host's network namespace reaches every repo",
            "a network of this repo",
        )
    host = body.get("HostConfig")
    if not isinstance(host, dict):
        host = body["HostConfig"] = {}  # for the defaults below; the daemon reads it as its own
    isolation.cgroupns_default(host, ctx.api_version)
    yield from limits.pids_limit(host, "HostConfig.", ctx.pids_limit, create=True)
    yield from limits.ulimits(host.get("Ulimits"), "HostConfig.", ctx.extra_capabilities, ctx.hard_limits)
    yield from _published_ports(body, host, ctx)
    if host.get("Privileged") is True:
        yield refuse("privileged", "Privileged", "privileged containers are refused", CDI_DEVICE)
    yield from _device_fields(host, ctx.repo_ref)
    runtime = host.get("Runtime") or ""
    if runtime not in ALLOWED_RUNTIMES:
        yield refuse(
            "runtime",
            runtime,
            f"runtime {runtime!r} is refused: containers here run under the daemon's default runtime "
            "(runc behind rdc's device guard)",
            "no --runtime (no runtime: in Compose); for devices, " + COMPOSE_DEVICES,
        )
    yield from _annotations(_dict(host.get("Annotations")))
    yield from isolation.host_config(host, ctx.extra_capabilities)
    yield from mounts.tmpfs(host)
    driver = host.get("VolumeDriver") or ""
    yield from mounts.volume(driver, {}, ctx.binds, "HostConfig.VolumeDriver")
    yield from mounts.binds(host, ctx.binds)
    yield from mounts.mounts(host, ctx.binds)


def _annotations(annotations: Mapping[str, Any]) -> Iterator[Finding]:
    for key in annotations:
        if key.lower().startswith(CDI_ANNOTATION_PREFIX):
            yield refuse(
                "cdi-annotation",
                key,
                f"annotation {key} is refused: it would request CDI devices",
                CDI_DEVICE,
            )
        elif not key.startswith(SAFE_ANNOTATION_PREFIXES):
            yield refuse(
                "annotation",
                key,
                f"annotation {key} is refused: annotations reach the container runtime, which acts on "
                "some (org.systemd.property.*, org.criu.*, run.oci.*); only org.opencontainers.image.* "
                "metadata passes",
                "a label (--label) for metadata",
            )


def container_update(body: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    yield from _device_fields(body, ctx.repo_ref)
    yield from isolation.resources(body, "")
    yield from limits.pids_limit(body, "", ctx.pids_limit, create=False)
    yield from limits.ulimits(body.get("Ulimits"), "", ctx.extra_capabilities, ctx.hard_limits)


def exec_create(body: Mapping[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    if body.get("Privileged") is True:
        yield refuse(
            "privileged",
            "Privileged",
            "privileged exec is refused",
            "exec without --privileged; devices come from " + CDI_DEVICE,
        )


def volume_create(body: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    name = body.get("Name") or "(unnamed)"
    options = body.get("DriverOpts")
    if not isinstance(options, dict):
        options = {}
    yield from mounts.volume(body.get("Driver") or "", options, ctx.binds, f"volume {name}")
    if body.get("DriverOpts") is not None:
        body["DriverOpts"] = options
    if body.get("ClusterVolumeSpec"):
        yield refuse("swarm", "ClusterVolumeSpec", "cluster volumes are refused (swarm)", "a local volume")


def network_create(body: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    return isolation.network_create(body)


def network_connect(body: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    endpoint = body.get("EndpointConfig")
    return isolation.endpoint_sysctls({"EndpointConfig": endpoint} if endpoint else {}, "")


def auth(body: dict[str, Any], ctx: RuleContext) -> Iterator[Finding]:
    return fetches.auth(body, ctx.registries)


# The checks of the routes that make a container run (`endpoints.Route.raw_check`, `runs_when`).


def start_body(target: Target, body: bytes) -> None:
    """A container start takes no body (older APIs read one as a HostConfig, unchecked) and no
    checkpoint: BadRequest otherwise."""
    if body.strip() not in (b"", b"{}", b"null"):
        raise BadRequest("container start takes no body (older APIs read one as HostConfig)")
    if any(v for name in ("checkpoint", "checkpoint-dir") for v in target.query.get(name, ())):
        # Refused on every checkpoint route; here it would restore from a directory of the caller's
        # choosing (only experimental daemons act on it: defence in depth).
        raise BadRequest(
            "starting from a checkpoint (checkpoint, checkpoint-dir) is refused; start without it"
        )


def sets_restart_policy(body: Any) -> bool:
    """Does an update's canonical body set a restart policy? Then the daemon starts the container on
    its own, unseen by the gate: the update is checked as a start."""
    policy = body.get("RestartPolicy") if isinstance(body, dict) else None
    name = policy.get("Name") if isinstance(policy, dict) else None
    return isinstance(name, str) and name not in ("", "no")


# The rules of the routes decided by their query and path alone (the body streams, unread).


def build(_: None, ctx: RuleContext) -> Iterator[Finding]:
    yield from isolation.build_query(ctx.query)
    yield from fetches.build_remote(ctx.query.get("remote", ()), ctx.registries)
    yield from limits.build_ulimits(ctx.query, ctx.extra_capabilities, ctx.hard_limits)


def image_create(_: None, ctx: RuleContext) -> Iterator[Finding]:
    return fetches.image_create(ctx.query, ctx.registries)


def image_search(_: None, ctx: RuleContext) -> Iterator[Finding]:
    return fetches.image_search(ctx.query, ctx.registries)


def plugin_privileges(_: None, ctx: RuleContext) -> Iterator[Finding]:
    return fetches.plugin_privileges(ctx.query, ctx.registries)


def image_push(_: None, ctx: RuleContext) -> Iterator[Finding]:
    return fetches.reference("push of", ctx.name, ctx.registries)


def distribution(_: None, ctx: RuleContext) -> Iterator[Finding]:
    return fetches.reference("registry lookup of", ctx.name, ctx.registries)


# A route's core rule (`endpoints.Route.rule`): a query route's is handed no body, an inspected
# route's its canonical body when that decoded to an object. Defaults the request left out are
# written into the body; bind sources are rewritten to their pinned staging paths later, by the
# route's `Pin`, once the request is admitted.
Rule = Callable[[Any, RuleContext], Iterable[Finding]]


@dataclass(frozen=True)
class Pin:
    """How a route's admitted body has its bind sources pinned (`endpoints.Route.pin`): whether it
    could name a host path at all (cheap: most bodies name none and skip pinning), and the pinning,
    which rewrites each source to its staging path in place and finds only sources that cannot be
    pinned (changed since they were checked)."""

    names_host_paths: Callable[[dict[str, Any]], bool]
    pin: Rule


def _create_names_host_paths(body: dict[str, Any]) -> bool:
    host = body.get("HostConfig")
    if not isinstance(host, dict):
        return False
    binds = host.get("Binds") or []
    return bool(host.get("Mounts")) or any(
        isinstance(b, str) and b.startswith("/") and ":" in b for b in binds
    )


def _pin_create(body: dict[str, Any], ctx: RuleContext) -> list[Finding]:
    host = body.get("HostConfig")
    if not isinstance(host, dict):
        return []
    return [*mounts.binds(host, ctx.binds), *mounts.mounts(host, ctx.binds)]


CREATE_PINS = Pin(_create_names_host_paths, _pin_create)
VOLUME_PINS = Pin(lambda body: bool(body.get("DriverOpts")), volume_create)
