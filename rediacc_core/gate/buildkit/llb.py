"""The checks on a BuildKit build graph (LLB, `solver/pb/ops.proto`) that a tenant sends itself.

A `Definition` is a list of serialized `Op`s; each op is one build step the daemon runs as given.
This is an allow-list over every field of the ops that reach the host: an exec step (`ExecOp`) may
not join the host's network, run privileged (`security=insecure`), get CDI devices, name a cgroup
parent or lift an rlimit the gate bounds for containers (`limits.py`); its mounts come only from
other steps, secrets, SSH agents, caches and tmpfs (the wire has no way to name a host path, and an
unknown mount type is refused). Sources are images, the client's own files (`local://`, sent over
its session), git and http(s), each address checked as a pull's is (`fetches.py`). Nested builds
(`BuildOp`, a graph read from a file at solve time) are refused, and so is any field or op the gate
does not know: a newer daemon may act on it.

Field numbers are those of BuildKit's ops.proto (v0.13, Engine 26.1, through v0.25, Engine 28.5;
BuildKit only ever adds fields).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from rediacc_core.gate.policy import fetches, limits
from rediacc_core.gate.policy.findings import Finding, refuse
from rediacc_core.gate.wire.protowire import MAX_DEPTH, Message, WireError

NET_UNSET, NET_HOST, NET_NONE = 0, 1, 2
SECURITY_SANDBOX, SECURITY_INSECURE = 0, 1
MOUNT_TYPES = {0: "bind", 1: "secret", 2: "ssh", 3: "cache", 4: "tmpfs"}
SOURCE_SCHEMES = ("docker-image://", "local://", "git://", "http://", "https://", "oci-layout://")

# The fields of each message the gate knows (and judges below); any other is refused.
_OP = frozenset({1, 2, 3, 4, 5, 6, 7, 10, 11})
_EXEC_OP = frozenset({1, 2, 3, 4, 5, 6})
_META = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12})
_MOUNT = frozenset({1, 2, 3, 4, 5, 6, 19, 20, 21, 22, 23, 24})
_DEFINITION = frozenset({1, 2, 3})

BUILT_IN_INSTEAD = "a plain RUN step (the repo's default network, no privileges)"


class Malformed(Exception):
    """A message the gate cannot read as the daemon would: refused whole."""


@dataclass(frozen=True)
class BuildPolicy:
    """What the machine allows a build step, as it allows a container (see `decide._Allowances`)."""

    extra_capabilities: frozenset[str] = frozenset()
    hard_limits: Mapping[str, int] = field(default_factory=limits.own_hard_limits)
    registries: fetches.Allowed = frozenset()


def unknown_fields(where: str, message: Message, known: frozenset[int]) -> Iterator[Finding]:
    for number in sorted(message.numbers() - known):
        yield refuse(
            "build-option",
            f"{where}#{number}",
            f"{where} field {number} is refused: not a field the gate knows, and a newer daemon "
            "may act on it",
            "a client and daemon of the versions this gate checks",
        )


def definition(
    data: bytes | Message | None, where: str, policy: BuildPolicy, depth: int = 0
) -> list[Finding]:
    """Every finding about the build graph `data` (a `pb.Definition`); raises `Malformed`."""
    if data is None:
        return []
    if depth > MAX_DEPTH:
        raise Malformed(f"{where} nests definitions deeper than {MAX_DEPTH}")
    try:
        message = data if isinstance(data, Message) else Message(data)
        found = list(unknown_fields(where, message, _DEFINITION))
        for index, raw in enumerate(message.blobs(1)):
            found += op(Message(raw), f"{where}.def[{index}]", policy)
        source = message.message(3)
        if source is not None:
            for index, info in enumerate(source.messages(2)):
                nested = info.message(3)
                if nested is not None:
                    found += definition(nested, f"{where}.Source.infos[{index}]", policy, depth + 1)
    except WireError as exc:
        raise Malformed(f"{where} cannot be read: {exc}") from exc
    return found


def op(message: Message, where: str, policy: BuildPolicy) -> list[Finding]:
    found = list(unknown_fields(where, message, _OP))
    exec_op = message.message(2)
    if exec_op is not None:
        found += exec_step(exec_op, f"{where}.exec", policy)
    source = message.message(3)
    if source is not None:
        found += list(source_op(source, f"{where}.source", policy))
    if message.has(5):
        found.append(
            refuse(
                "build-option",
                "BuildOp",
                f"{where}: a nested build (BuildOp) is refused: its steps are read from a file at "
                "build time, where the gate cannot check them",
                "the steps themselves in the build graph, or a Dockerfile",
            )
        )
    return found


def source_op(message: Message, where: str, policy: BuildPolicy) -> Iterator[Finding]:
    identifier = message.text(1)
    if not identifier.startswith(SOURCE_SCHEMES):
        yield refuse(
            "build-option",
            identifier,
            f"{where} {identifier!r} is refused: not a source the gate knows",
            "an image (docker-image://), the build context (local://), git or http(s)",
        )
    elif identifier.startswith("docker-image://"):
        yield from fetches.reference(
            f"{where} image", identifier.removeprefix("docker-image://"), policy.registries
        )
    elif identifier.startswith(("http://", "https://")):
        yield from fetches.url(f"{where} URL", identifier, policy.registries)
    elif identifier.startswith("git://"):
        remote = identifier.removeprefix("git://").partition("#")[0]
        yield from fetches.url(f"{where} git remote", "https://" + remote, policy.registries)


def exec_step(message: Message, where: str, policy: BuildPolicy) -> list[Finding]:
    """The checks of one `ExecOp` (a RUN step)."""
    found = list(unknown_fields(where, message, _EXEC_OP))
    meta = message.message(1)
    if meta is not None:
        found += meta_fields(meta, f"{where}.meta", policy)
    for index, mount in enumerate(message.messages(2)):
        found += mount_fields(mount, f"{where}.mounts[{index}]")
    found += network(message.integer(3), f"{where}.network")
    found += security(message.integer(4), f"{where}.security")
    found += cdi_devices([d.text(1) for d in message.messages(6)], f"{where}.cdiDevices")
    return found


def network(mode: int, where: str) -> list[Finding]:
    if mode in (NET_UNSET, NET_NONE):
        return []
    shown = "host" if mode == NET_HOST else str(mode)
    return [
        refuse(
            "namespace",
            "network",
            f"{where}={shown} is refused: build steps must not join the host's network",
            "the default network, or --network none",
        )
    ]


def security(mode: int, where: str) -> list[Finding]:
    if mode == SECURITY_SANDBOX:
        return []
    shown = "insecure" if mode == SECURITY_INSECURE else str(mode)
    return [
        refuse(
            "privileged",
            "security",
            f"{where}={shown} is refused: a privileged build step holds every device and capability "
            "of the host",
            BUILT_IN_INSTEAD,
        )
    ]


def cdi_devices(names: list[str], where: str) -> list[Finding]:
    return [
        refuse(
            "raw-device",
            name,
            f"{where} {name!r} is refused: build steps get no devices (grants are for the repo's containers)",
            "docker run --device <the granted CDI name> on the built image",
        )
        for name in names
    ]


def cgroup_parent(value: str, where: str) -> list[Finding]:
    if not value:
        return []
    return [
        refuse(
            "cgroup-parent",
            value,
            f"{where} {value!r} is refused: a build step's cgroup must stay under the repo daemon's",
            "no cgroup parent (the daemon's default)",
        )
    ]


def meta_fields(message: Message, where: str, policy: BuildPolicy) -> list[Finding]:
    found = list(unknown_fields(where, message, _META))
    found += cgroup_parent(message.text(10), f"{where}.cgroupParent")
    entries = [{"Name": u.text(1), "Soft": u.signed(2), "Hard": u.signed(3)} for u in message.messages(9)]
    found += limits.ulimits(entries, f"build step {where}: ", policy.extra_capabilities, policy.hard_limits)
    return found


def mount_fields(message: Message, where: str) -> list[Finding]:
    found = list(unknown_fields(where, message, _MOUNT))
    kind = message.integer(6)
    if kind not in MOUNT_TYPES:
        found.append(
            refuse(
                "mount-type",
                str(kind),
                f"{where} mount type {kind} is refused: not one the gate knows",
                "bind (from another step), secret, ssh, cache or tmpfs",
            )
        )
    return found
