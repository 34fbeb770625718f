"""The shapes of the request bodies the gate decodes, as the daemon's Go structs declare them.

Only what decides how a body is read lives here: each struct's JSON field names (Go's names, or the
`json:` tag where one renames a field; embedded structs are listed flat, as Go promotes their
fields), the Go type of the fields the rules read or whose range matters, and whether the struct is
*strict*. A strict struct governs hardware (HostConfig and everything that can name a device, a
mount source or a privilege): a non-empty field the table does not know is refused, because a newer
daemon might act on it. Other structs pass unknown fields through unchanged. Fields whose type does
not matter to the gate are `ANY` (still checked for ambiguous keys, forwarded as decoded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

ScalarKind = Literal["string", "bool", "int", "uint", "float"]


@dataclass(frozen=True)
class Scalar:
    kind: ScalarKind
    bits: int = 64  # Go's int and uint are 64 bits on every platform the daemon runs on


@dataclass(frozen=True)
class AnyValue:
    """Any JSON value: an `interface{}`, or a field whose exact type does not matter to the gate."""


@dataclass(frozen=True)
class ListOf:
    item: FieldType


@dataclass(frozen=True)
class MapOf:
    """A Go map: keys are data, matched exactly (so `a` and `A` are two keys, not a fold variant)."""

    value: FieldType


@dataclass(frozen=True)
class StructRef:
    name: str


FieldType = Scalar | AnyValue | ListOf | MapOf | StructRef


@dataclass(frozen=True)
class Struct:
    name: str
    fields: Mapping[str, FieldType]
    strict: bool = False
    # Keys that must not appear non-empty even though Go would ignore them (see CREATE_REQUEST).
    forbidden: frozenset[str] = field(default_factory=frozenset)


STR = Scalar("string")
BOOL = Scalar("bool")
INT = Scalar("int")
UINT = Scalar("uint")
UINT16 = Scalar("uint", 16)
UINT32 = Scalar("uint", 32)
ANY = AnyValue()
STRS = ListOf(STR)
STR_MAP = MapOf(STR)


def _s(name: str) -> StructRef:
    return StructRef(name)


# --- container (api/types/container) ---------------------------------------------------------

_RESOURCES: dict[str, FieldType] = {
    "CpuShares": INT,
    "Memory": INT,
    "NanoCpus": INT,
    "CgroupParent": STR,
    "BlkioWeight": UINT16,
    "BlkioWeightDevice": ANY,
    "BlkioDeviceReadBps": ANY,
    "BlkioDeviceWriteBps": ANY,
    "BlkioDeviceReadIOps": ANY,
    "BlkioDeviceWriteIOps": ANY,
    "CpuPeriod": INT,
    "CpuQuota": INT,
    "CpuRealtimePeriod": INT,
    "CpuRealtimeRuntime": INT,
    "CpusetCpus": STR,
    "CpusetMems": STR,
    "Devices": ListOf(_s("DeviceMapping")),
    "DeviceCgroupRules": STRS,
    "DeviceRequests": ListOf(_s("DeviceRequest")),
    "KernelMemory": INT,
    "KernelMemoryTCP": INT,
    "MemoryReservation": INT,
    "MemorySwap": INT,
    "MemorySwappiness": INT,
    "OomKillDisable": BOOL,
    "PidsLimit": INT,
    "Ulimits": ListOf(_s("Ulimit")),
    "CpuCount": INT,
    "CpuPercent": INT,
    "IOMaximumIOps": UINT,
    "IOMaximumBandwidth": UINT,
}

_HOST_CONFIG: dict[str, FieldType] = {
    "Binds": STRS,
    "ContainerIDFile": STR,
    "LogConfig": _s("LogConfig"),
    "NetworkMode": STR,
    "PortBindings": MapOf(ListOf(_s("PortBinding"))),
    "RestartPolicy": ANY,
    "AutoRemove": BOOL,
    "VolumeDriver": STR,
    "VolumesFrom": STRS,
    "ConsoleSize": ListOf(UINT),
    "Annotations": STR_MAP,
    "CapAdd": STRS,
    "CapDrop": STRS,
    "CgroupnsMode": STR,
    "Dns": STRS,
    "DnsOptions": STRS,
    "DnsSearch": STRS,
    "ExtraHosts": STRS,
    "GroupAdd": STRS,
    "IpcMode": STR,
    "Cgroup": STR,
    "Links": STRS,
    "OomScoreAdj": INT,
    "PidMode": STR,
    "Privileged": BOOL,
    "PublishAllPorts": BOOL,
    "ReadonlyRootfs": BOOL,
    "SecurityOpt": STRS,
    "StorageOpt": STR_MAP,
    "Tmpfs": STR_MAP,
    "UTSMode": STR,
    "UsernsMode": STR,
    "ShmSize": INT,
    "Sysctls": STR_MAP,
    "Runtime": STR,
    "Isolation": STR,
    **_RESOURCES,
    "Mounts": ListOf(_s("Mount")),
    "MaskedPaths": STRS,
    "ReadonlyPaths": STRS,
    "Init": BOOL,
}

_CONFIG: dict[str, FieldType] = {
    "Hostname": STR,
    "Domainname": STR,
    "User": STR,
    "AttachStdin": BOOL,
    "AttachStdout": BOOL,
    "AttachStderr": BOOL,
    "ExposedPorts": MapOf(ANY),
    "Tty": BOOL,
    "OpenStdin": BOOL,
    "StdinOnce": BOOL,
    "Env": STRS,
    "Cmd": ANY,  # strslice: a string or a list
    "Healthcheck": ANY,
    "ArgsEscaped": BOOL,
    "Image": STR,
    "Volumes": MapOf(ANY),
    "WorkingDir": STR,
    "Entrypoint": ANY,
    "NetworkDisabled": BOOL,
    "MacAddress": STR,
    "OnBuild": STRS,
    "Labels": STR_MAP,
    "StopSignal": STR,
    "StopTimeout": INT,
    "Shell": STRS,
}

# Daemons read HostConfig fields from the top level of a create body too (a deprecated embedded
# struct; dockerd 26.1 still does, for every API version, when the body has no HostConfig). A
# top-level key naming a HostConfig field is refused when it is a list or an object, even an empty
# one (`"MaskedPaths": []` switches /proc masking off), or a non-empty scalar, so no daemon version
# can take settings from a place the gate does not check.
_LEGACY_TOP_LEVEL = frozenset(_HOST_CONFIG) | {"Cpuset"}

STRUCTS: dict[str, Struct] = {}


def _add(
    name: str, fields: Mapping[str, FieldType], strict: bool = False, forbidden: frozenset[str] = frozenset()
) -> None:
    STRUCTS[name] = Struct(name, dict(fields), strict, forbidden)


_add(
    "CreateRequest",
    {**_CONFIG, "HostConfig": _s("HostConfig"), "NetworkingConfig": _s("NetworkingConfig")},
    forbidden=_LEGACY_TOP_LEVEL - frozenset(_CONFIG),
)
_add("LogConfig", {"Type": STR, "Config": STR_MAP}, strict=True)
_add("NetworkingConfig", {"EndpointsConfig": MapOf(_s("EndpointSettings"))})
# `POST /networks/{id}/connect`: the endpoint's settings are checked as a create's (sysctls).
_add("NetworkConnectRequest", {"Container": STR, "EndpointConfig": _s("EndpointSettings")}, strict=True)
# api/types/network: a struct, so that `driveropts` reads as the DriverOpts Go fills from it.
_add(
    "EndpointSettings",
    {
        "IPAMConfig": _s("EndpointIPAMConfig"),
        "Links": ANY,
        "Aliases": ANY,
        "DriverOpts": STR_MAP,
        "GwPriority": ANY,
        "NetworkID": ANY,
        "EndpointID": ANY,
        "Gateway": ANY,
        "IPAddress": ANY,
        "MacAddress": ANY,
        "IPPrefixLen": ANY,
        "IPv6Gateway": ANY,
        "GlobalIPv6Address": ANY,
        "GlobalIPv6PrefixLen": ANY,
        "DNSNames": ANY,
    },
    strict=True,
)
_add("EndpointIPAMConfig", {"IPv4Address": ANY, "IPv6Address": ANY, "LinkLocalIPs": ANY}, strict=True)
_add("HostConfig", _HOST_CONFIG, strict=True)
# go-connections' nat.PortBinding: read as a struct, so that `hostport` is the HostPort Go fills.
_add("PortBinding", {"HostIp": STR, "HostPort": STR}, strict=True)
_add("UpdateConfig", {**_RESOURCES, "RestartPolicy": ANY}, strict=True)
_add("Ulimit", {"Name": STR, "Hard": INT, "Soft": INT}, strict=True)
_add("DeviceMapping", {"PathOnHost": STR, "PathInContainer": STR, "CgroupPermissions": STR}, strict=True)
_add(
    "DeviceRequest",
    {
        "Driver": STR,
        "Count": INT,
        "DeviceIDs": STRS,
        "Capabilities": ListOf(STRS),
        "Options": STR_MAP,
    },
    strict=True,
)
_add(
    "ExecConfig",
    {
        "User": STR,
        "Privileged": BOOL,
        "Tty": BOOL,
        "ConsoleSize": ListOf(UINT),
        "AttachStdin": BOOL,
        "AttachStderr": BOOL,
        "AttachStdout": BOOL,
        "Detach": BOOL,
        "DetachKeys": STR,
        "Env": STRS,
        "WorkingDir": STR,
        "Cmd": STRS,
    },
    strict=True,
)

# --- mounts (api/types/mount), shared by containers and swarm services ------------------------

_add(
    "Mount",
    {
        "Type": STR,
        "Source": STR,
        "Target": STR,
        "ReadOnly": BOOL,
        "Consistency": STR,
        "BindOptions": _s("BindOptions"),
        "VolumeOptions": _s("VolumeOptions"),
        "ImageOptions": _s("ImageOptions"),
        "TmpfsOptions": _s("TmpfsOptions"),
        "ClusterOptions": _s("ClusterOptions"),
    },
    strict=True,
)
_add(
    "BindOptions",
    {
        "Propagation": STR,
        "NonRecursive": BOOL,
        "CreateMountpoint": BOOL,
        "ReadOnlyNonRecursive": BOOL,
        "ReadOnlyForceRecursive": BOOL,
    },
    strict=True,
)
_add(
    "VolumeOptions",
    {"NoCopy": BOOL, "Labels": STR_MAP, "Subpath": STR, "DriverConfig": _s("Driver")},
    strict=True,
)
_add("Driver", {"Name": STR, "Options": STR_MAP}, strict=True)
_add("ImageOptions", {"Subpath": STR}, strict=True)
_add("TmpfsOptions", {"SizeBytes": INT, "Mode": UINT32, "Options": ListOf(STRS)}, strict=True)
_add("ClusterOptions", {}, strict=True)

# --- volumes and networks ----------------------------------------------------------------------

_add(
    "VolumeCreateOptions",
    {"ClusterVolumeSpec": ANY, "Driver": STR, "DriverOpts": STR_MAP, "Labels": STR_MAP, "Name": STR},
    strict=True,
)
_add(
    "NetworkCreateRequest",
    {
        "Name": STR,
        "CheckDuplicate": BOOL,
        "Driver": STR,
        "Scope": STR,
        "Internal": BOOL,
        "Attachable": BOOL,
        "Ingress": BOOL,
        "ConfigOnly": BOOL,
        "ConfigFrom": ANY,
        "IPAM": _s("IPAM"),
        "EnableIPv4": BOOL,
        "EnableIPv6": BOOL,
        "Options": STR_MAP,
        "Labels": STR_MAP,
    },
    strict=True,
)
_add("IPAM", {"Driver": STR, "Config": ANY, "Options": STR_MAP}, strict=True)

# --- registries (api/types/registry) -----------------------------------------------------------

# `/auth`: the daemon logs in to `serveraddress`, from the host's network.
_add(
    "AuthConfig",
    {
        "username": STR,
        "password": STR,
        "auth": STR,
        "email": STR,
        "serveraddress": STR,
        "identitytoken": STR,
        "registrytoken": STR,
    },
    strict=True,
)
