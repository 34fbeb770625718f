"""BuildKit's gRPC API (`POST /grpc`, which buildx and Compose drive): which calls pass, and the
checks on the requests that carry build steps.

Every call is named by its gRPC path. `METHODS` says what the gate does with each: `forward`
(reads, the session, status, history: nothing in them reaches the host) or `check`: each request
message is decoded (`protowire`) and judged before it is forwarded. A path the table lacks is
refused, as an unknown Engine API route is.

Checked calls:

- `Control/Solve` and `LLBBridge/Solve`: no entitlements (`network.host`, `security.insecure`,
  `device`); the frontend is the daemon's built-in Dockerfile frontend (`dockerfile.v0`) or none,
  with a build graph the gate reads (`llb.py`), never `gateway.v0` (a frontend image of the
  tenant's choosing, whose steps go straight to the daemon); frontend attributes from an
  allow-list (`FRONTEND_ATTRS`, `FRONTEND_ATTR_PREFIXES`), with the network, cgroup parent and
  rlimits bounded as for containers; exporters and caches of the known types; every build graph
  (the definition and the frontend inputs) checked op by op.
- `LLBBridge/NewContainer` (buildx's debug shell): its mounts and network, as an exec step's.
- `LLBBridge/ExecProcess`: every `Init` message's process settings and security mode.

The built-in Dockerfile frontend hands the build to another frontend image when the Dockerfile
starts with `# syntax=<image>` or `build-arg:BUILDKIT_SYNTAX` names one, unless a `cmdline`
attribute is present (buildkit `frontend/dockerfile/builder/build.go`: that attribute marks a
request already forwarded). So the gate refuses `BUILDKIT_SYNTAX` and adds `cmdline` to every
`dockerfile.v0` request that lacks it (`pin_frontend`): the daemon's own frontend builds every
Dockerfile, and the steps it makes are bounded by the daemon's own entitlements (none granted).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from rediacc_core.gate.buildkit import llb
from rediacc_core.gate.buildkit.llb import BuildPolicy, Malformed
from rediacc_core.gate.policy import fetches, limits
from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.wire.protowire import Message, WireError, map_entry

CONTROL = "/moby.buildkit.v1.Control/"
BRIDGE = "/moby.buildkit.v1.frontend.LLBBridge/"
BUILT_IN_FRONTEND = "dockerfile.v0"
PIN_ATTR = "cmdline"  # its presence stops the built-in frontend forwarding to a `# syntax=` image
PIN_NOTE = "pinned the built-in Dockerfile frontend (a `# syntax=` line is not followed)"

Action = Literal["forward", "check"]

METHODS: dict[str, Action] = {
    **{
        CONTROL + name: "forward"
        for name in (
            "DiskUsage", "Prune", "Status", "Session", "ListWorkers", "Info", "ListenBuildHistory",
            "UpdateBuildHistory",
        )
    },
    CONTROL + "Solve": "check",
    **{
        BRIDGE + name: "forward"
        for name in (
            "ResolveImageConfig", "ResolveSourceMeta", "ReadFile", "ReadDir", "StatFile", "Evaluate", "Ping",
            "Return", "Inputs", "ReleaseContainer", "Warn",
        )
    },
    BRIDGE + "Solve": "check",
    BRIDGE + "NewContainer": "check",
    BRIDGE + "ExecProcess": "check",
    # The build history's blobs, from a read-only view of the daemon's content store.
    **{
        "/containerd.services.content.v1.Content/" + name: "forward"
        for name in ("Info", "List", "Read", "Status", "ListStatuses")
    },
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export": "forward",
    "/grpc.health.v1.Health/Check": "forward",
}  # fmt: skip

# Frontend attributes (buildkit frontend/dockerui) that change nothing the gate bounds, or that it
# checks below; every other is refused.
FRONTEND_ATTRS = frozenset(
    {
        "filename", "target", "platform", "no-cache", "image-resolve-mode", "multi-platform", "hostname",
        "add-hosts", "shm-size", "ulimit", "force-network-mode", "contextsubdir", "contextkey",
        "dockerfilekey", "requestid", "frontend.caps", "cache-from", "cache-imports", "context", PIN_ATTR,
        "build-arg:BUILDKIT_DOCKERFILE_CHECK",
    }
)  # fmt: skip
FRONTEND_ATTR_PREFIXES = ("build-arg:", "label:", "attest:", "context:", "input-metadata:", "vcs:")
NETWORK_MODES = frozenset({"", "sandbox", "none"})
EXPORTERS = frozenset({"moby", "image", "docker", "oci", "tar", "local"})
CACHES = frozenset({"inline", "registry", "local", "gha", "s3", "azblob"})
NAMED_CONTEXT_SCHEMES = (
    "docker-image://",
    "local:",
    "input:",
    "oci-layout://",
    "git://",
    "git@",
    "http://",
    "https://",
    "target:",
)

FRONTEND_INSTEAD = (
    "a Dockerfile built by the daemon's own frontend (docker build, without --build-arg BUILDKIT_SYNTAX)"
)

# SolveRequest fields (control.proto and gateway.proto), each message's known set.
_CONTROL_SOLVE = frozenset(range(1, 17))
_BRIDGE_SOLVE = frozenset({1, 2, 3, 5, 6, 10, 11, 12, 13, 14, 15})
_NEW_CONTAINER = frozenset({1, 2, 3, 4, 5, 6, 7})
_INIT = frozenset({1, 2, 3, 4, 5, 6})


@dataclass(frozen=True)
class Verdict:
    """What to do with one request message: `forward` it (as `message`, maybe rewritten), or refuse."""

    findings: tuple[Finding, ...]
    message: bytes
    notes: tuple[str, ...] = ()  # for the gate's log: what the gate changed

    @property
    def refused(self) -> bool:
        return bool(self.findings)


def action(path: str) -> Action | None:
    return METHODS.get(path)


def check(path: str, message: bytes, policy: BuildPolicy) -> Verdict:
    """The verdict on one request message of the checked call `path`."""
    checker = _CHECKERS[path]
    try:
        return checker(message, policy)
    except (WireError, Malformed) as exc:
        what = refuse("bad-request", path, f"{path}: the request cannot be read ({exc})", None)
        return Verdict((what,), message)


def _control_solve(data: bytes, policy: BuildPolicy) -> Verdict:
    req = Message(data)
    where = "SolveRequest"
    found = list(llb.unknown_fields(where, req, _CONTROL_SOLVE))
    found += entitlements(req.texts(9), where)
    found += llb.definition(req.message(2), f"{where}.Definition", policy)
    frontend, attrs = req.text(6), req.string_map(7)
    found += frontend_checks(frontend, attrs, where, policy)
    for name, entry in req.message_map(10).items():
        found += llb.definition(entry.message(2), f"{where}.FrontendInputs[{name}]", policy)
    exporters = [(e.text(1), e.string_map(2)) for e in req.messages(13)]
    if req.has(3):
        exporters.append((req.text(3), req.string_map(4)))
    for kind, exporter_attrs in exporters:
        found += exporter(kind, exporter_attrs, where, policy)
    cache = req.message(8)
    if cache is not None:
        found += cache_checks(cache, where, policy)
    return _pinned(data, frontend, attrs, 7, found)


def _bridge_solve(data: bytes, policy: BuildPolicy) -> Verdict:
    req = Message(data)
    where = "LLBBridge.Solve"
    found = list(llb.unknown_fields(where, req, _BRIDGE_SOLVE))
    found += llb.definition(req.message(1), f"{where}.Definition", policy)
    frontend, attrs = req.text(2), req.string_map(3)
    found += frontend_checks(frontend, attrs, where, policy)
    for name, entry in req.message_map(13).items():
        found += llb.definition(entry.message(2), f"{where}.FrontendInputs[{name}]", policy)
    for entry in req.messages(12):
        found += cache_entry(entry.text(1), entry.string_map(2), f"{where}.CacheImports", policy)
    return _pinned(data, frontend, attrs, 3, found)


def _pinned(
    data: bytes, frontend: str, attrs: dict[str, str], attrs_field: int, found: list[Finding]
) -> Verdict:
    if found:
        return Verdict(tuple(found), data)
    if frontend == BUILT_IN_FRONTEND and PIN_ATTR not in attrs:
        # A map entry appended to the message: Go's decoder adds it to the map as any other.
        return Verdict((), data + map_entry(attrs_field, PIN_ATTR, ""), (PIN_NOTE,))
    return Verdict((), data)


def _new_container(data: bytes, policy: BuildPolicy) -> Verdict:
    req = Message(data)
    where = "NewContainerRequest"
    found = list(llb.unknown_fields(where, req, _NEW_CONTAINER))
    for index, mount in enumerate(req.messages(2)):
        found += llb.mount_fields(mount, f"{where}.Mounts[{index}]")
    found += llb.network(req.integer(3), f"{where}.Network")
    return Verdict(tuple(found), data)


def _exec_message(data: bytes, policy: BuildPolicy) -> Verdict:
    req = Message(data)
    init = req.message(2)
    if init is None:
        return Verdict((), data)  # stdin, a resize, a signal
    where = "ExecProcess.Init"
    found = list(llb.unknown_fields(where, init, _INIT))
    meta = init.message(2)
    if meta is not None:
        found += llb.meta_fields(meta, f"{where}.Meta", policy)
    found += llb.security(init.integer(5), f"{where}.Security")
    return Verdict(tuple(found), data)


_CHECKERS: dict[str, Callable[[bytes, BuildPolicy], Verdict]] = {
    CONTROL + "Solve": _control_solve,
    BRIDGE + "Solve": _bridge_solve,
    BRIDGE + "NewContainer": _new_container,
    BRIDGE + "ExecProcess": _exec_message,
}


# How a user asks for an entitlement: buildx turns `--network host` into network.host itself.
_ASKED_BY = {"network.host": "docker build --network host, or --allow network.host"}


def entitlements(names: list[str], where: str) -> list[Finding]:
    return [
        refuse(
            "build-option",
            name,
            f"{where}.Entitlements {name!r} ({_ASKED_BY.get(name, f'--allow {name}')}) is refused: it would "
            "let build steps reach the host (its network, every device, or privileged mode)",
            "a build without --network host or --allow (steps run on the repo's network, unprivileged)",
        )
        for name in names
    ]


def frontend_checks(frontend: str, attrs: dict[str, str], where: str, policy: BuildPolicy) -> list[Finding]:
    found: list[Finding] = []
    if frontend not in ("", BUILT_IN_FRONTEND):
        found.append(
            refuse(
                "build-option",
                frontend,
                f"{where}.Frontend {frontend!r} is refused: a frontend image sends build steps the gate "
                "never sees",
                FRONTEND_INSTEAD,
            )
        )
    for name, value in sorted(attrs.items()):
        found += frontend_attr(name, value, f"{where} frontend attribute", policy)
    return found


def frontend_attr(name: str, value: str, where: str, policy: BuildPolicy) -> Iterator[Finding]:
    if name == "build-arg:BUILDKIT_SYNTAX":
        yield refuse(
            "build-option",
            name,
            f"{where} {name}={value} is refused: it names a frontend image, whose build steps the gate "
            "never sees",
            FRONTEND_INSTEAD,
        )
    elif name == "cgroup-parent":
        yield from llb.cgroup_parent(value, f"{where} {name}")
    elif name == "force-network-mode":
        if value not in NETWORK_MODES:
            yield from llb.network(llb.NET_HOST if value == "host" else -1, f"{where} {name}")
    elif name == "ulimit":
        yield from _ulimit_attr(value, f"{where} {name}", policy)
    elif name == "context" or name.startswith("context:"):
        yield from _context(name, value, where, policy)
    elif name not in FRONTEND_ATTRS and not name.startswith(FRONTEND_ATTR_PREFIXES):
        yield refuse(
            "build-option",
            name,
            f"{where} {name!r} is refused: not one the gate knows, so it may set what the gate bounds",
            "the docker build options (--build-arg, --label, --target, --platform, --network none, ...)",
        )


def _ulimit_attr(value: str, where: str, policy: BuildPolicy) -> Iterator[Finding]:
    entries = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        name, _, limit = item.partition("=")
        soft, _, hard = limit.partition(":")
        try:
            entries.append({"Name": name, "Soft": int(soft), "Hard": int(hard or soft)})
        except ValueError:
            yield refuse(
                "ulimit",
                item,
                f"{where} {item!r} cannot be read",
                "name=soft[:hard], such as nofile=1024:2048",
            )
    yield from limits.ulimits(entries, f"{where}: ", policy.extra_capabilities, policy.hard_limits)


def _context(name: str, value: str, where: str, policy: BuildPolicy) -> Iterator[Finding]:
    if name == "context" and not value.startswith(("http://", "https://", "git://", "git@")):
        return  # the name of the client's local context
    if name != "context" and not value.startswith(NAMED_CONTEXT_SCHEMES):
        yield refuse(
            "build-option",
            name,
            f"{where} {name}={value} is refused: not a context the gate knows",
            "docker-image://, a local directory, another stage, git or an http(s) URL",
        )
    elif value.startswith("docker-image://"):
        yield from fetches.reference(
            f"{where} {name}", value.removeprefix("docker-image://"), policy.registries
        )
    elif value.startswith(("http://", "https://")):
        yield from fetches.url(f"{where} {name}", value, policy.registries)


def exporter(kind: str, attrs: dict[str, str], where: str, policy: BuildPolicy) -> Iterator[Finding]:
    if kind not in EXPORTERS:
        yield refuse(
            "build-option",
            kind,
            f"{where} exporter {kind!r} is refused: not one the gate knows",
            "--load, --output type=local|tar|oci|docker|image",
        )
    for ref in filter(None, attrs.get("name", "").split(",")):
        yield from fetches.reference(f"{where} exporter name", ref.strip(), policy.registries)


def cache_checks(cache: Message, where: str, policy: BuildPolicy) -> Iterator[Finding]:
    for ref in [cache.text(1), *cache.texts(2)]:
        if ref:
            yield from fetches.reference(f"{where} cache ref", ref, policy.registries)
    for number, what in ((4, "Cache.Exports"), (5, "Cache.Imports")):
        for entry in cache.messages(number):
            yield from cache_entry(entry.text(1), entry.string_map(2), f"{where}.{what}", policy)


def cache_entry(kind: str, attrs: dict[str, str], where: str, policy: BuildPolicy) -> Iterator[Finding]:
    if kind not in CACHES:
        yield refuse(
            "build-option",
            kind,
            f"{where} type {kind!r} is refused: not a cache the gate knows",
            ", ".join(sorted(CACHES)),
        )
    if kind == "registry" and attrs.get("ref"):
        yield from fetches.reference(f"{where} ref", attrs["ref"], policy.registries)
