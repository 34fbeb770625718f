"""Which rule governs each field of every request body the gate decodes: nothing left unclassified.

Every field of every struct in `decode_fields.STRUCTS` is listed here with the rule id that checks
it (see `rules.py` for the list), or `FREE` when the field cannot reach the host, a device or another
repo (with the reason in a comment where it is not obvious), or `NESTED` when it is a struct whose own
fields are classified. `tests/gate/test_api_coverage.py` fails when a struct field, or a field of the
daemon's swagger for the served API versions, has no entry, so a field added by a newer Engine API is
refused (strict structs) until somebody classifies it here.
"""

from __future__ import annotations

FREE = "free"
NESTED = "nested"

_RESOURCES = {
    "CpuShares": FREE,
    "Memory": FREE,
    "NanoCpus": FREE,
    "CgroupParent": "cgroup-parent",
    "BlkioWeight": FREE,
    # Throttle entries name a host block device only to set this container's own limit on it.
    "BlkioWeightDevice": FREE,
    "BlkioDeviceReadBps": FREE,
    "BlkioDeviceWriteBps": FREE,
    "BlkioDeviceReadIOps": FREE,
    "BlkioDeviceWriteIOps": FREE,
    "CpuPeriod": FREE,
    "CpuQuota": FREE,
    "CpuRealtimePeriod": FREE,
    "CpuRealtimeRuntime": FREE,
    "CpusetCpus": FREE,
    "CpusetMems": FREE,
    "Devices": "raw-device",
    "DeviceCgroupRules": "device-cgroup-rules",
    "DeviceRequests": "device-request-driver",
    "KernelMemory": FREE,
    "KernelMemoryTCP": FREE,
    "MemoryReservation": FREE,
    "MemorySwap": FREE,
    "MemorySwappiness": FREE,
    "OomKillDisable": "oom",
    "PidsLimit": "pids-limit",
    "Ulimits": NESTED,
    "CpuCount": FREE,
    "CpuPercent": FREE,
    "IOMaximumIOps": FREE,
    "IOMaximumBandwidth": FREE,
}

FIELDS: dict[str, dict[str, str]] = {
    "CreateRequest": {
        "Hostname": FREE,
        "Domainname": FREE,
        "User": FREE,  # a user inside the container's own user namespace view
        "AttachStdin": FREE,
        "AttachStdout": FREE,
        "AttachStderr": FREE,
        "ExposedPorts": "publish-port",  # what `PublishAllPorts` publishes
        "Tty": FREE,
        "OpenStdin": FREE,
        "StdinOnce": FREE,
        "Env": "plugins",  # vendor plugins read their own variables (visible devices, requirements)
        "Cmd": FREE,
        "Healthcheck": FREE,
        "ArgsEscaped": FREE,
        "Image": FREE,
        "Volumes": FREE,  # anonymous volumes: local, made with HostConfig.VolumeDriver (checked)
        "WorkingDir": FREE,
        "Entrypoint": FREE,
        "NetworkDisabled": FREE,
        "MacAddress": FREE,
        "OnBuild": FREE,
        "Labels": FREE,
        "StopSignal": FREE,
        "StopTimeout": FREE,
        "Shell": FREE,
        "HostConfig": NESTED,
        "NetworkingConfig": NESTED,
    },
    "NetworkingConfig": {"EndpointsConfig": NESTED},  # endpoints of the repo's own networks
    "NetworkConnectRequest": {"Container": FREE, "EndpointConfig": NESTED},
    "EndpointSettings": {
        "IPAMConfig": NESTED,
        "Links": FREE,  # containers of the same repo daemon
        "Aliases": FREE,
        "DriverOpts": "sysctl",  # the per-interface sysctls ride here (and the interface's name)
        "GwPriority": FREE,
        # Operational data the daemon reports back; on a request it is ignored or names the repo's own
        # network's addresses.
        "NetworkID": FREE,
        "EndpointID": FREE,
        "Gateway": FREE,
        "IPAddress": FREE,
        "MacAddress": FREE,
        "IPPrefixLen": FREE,
        "IPv6Gateway": FREE,
        "GlobalIPv6Address": FREE,
        "GlobalIPv6PrefixLen": FREE,
        "DNSNames": FREE,
    },
    "EndpointIPAMConfig": {"IPv4Address": FREE, "IPv6Address": FREE, "LinkLocalIPs": FREE},
    "HostConfig": {
        "Binds": "bind-root",
        "ContainerIDFile": FREE,  # client side only
        "LogConfig": NESTED,
        "NetworkMode": "namespace",
        "PortBindings": "publish-port",
        "RestartPolicy": FREE,
        "AutoRemove": FREE,
        "VolumeDriver": "volume-driver",
        "VolumesFrom": FREE,  # containers of the same repo daemon, checked when created
        "ConsoleSize": FREE,
        "Annotations": "annotation",  # and cdi-annotation for the CDI prefix
        "CapAdd": "capability",
        "CapDrop": FREE,
        "CgroupnsMode": "namespace",
        "Dns": FREE,
        "DnsOptions": FREE,
        "DnsSearch": FREE,
        "ExtraHosts": FREE,
        "GroupAdd": FREE,  # a group grants nothing the container was not given
        "IpcMode": "namespace",
        "Cgroup": "namespace",
        "Links": FREE,
        "OomScoreAdj": "oom",
        "PidMode": "namespace",
        "Privileged": "privileged",
        "PublishAllPorts": "publish-port",
        "ReadonlyRootfs": FREE,
        "SecurityOpt": "security-opt",
        "StorageOpt": "storage-opt",
        "Tmpfs": "tmpfs-option",
        "UTSMode": "namespace",
        "UsernsMode": "namespace",
        "ShmSize": FREE,
        "Sysctls": "sysctl",
        "Runtime": "runtime",
        "Isolation": "isolation",
        **_RESOURCES,
        "Mounts": NESTED,
        "MaskedPaths": "masked-paths",
        "ReadonlyPaths": "masked-paths",
        "Init": FREE,
    },
    "LogConfig": {"Type": "log-driver", "Config": FREE},  # options of an admitted driver
    "UpdateConfig": {**_RESOURCES, "RestartPolicy": FREE},
    "Ulimit": {"Name": "ulimit", "Hard": "ulimit", "Soft": "ulimit"},
    "PortBinding": {"HostIp": "publish-port", "HostPort": "publish-port"},
    "DeviceMapping": {
        "PathOnHost": "raw-device",
        "PathInContainer": "raw-device",
        "CgroupPermissions": "raw-device",
    },
    "DeviceRequest": {
        "Driver": "device-request-driver",
        "Count": "device-request-driver",
        "DeviceIDs": "grant",
        "Capabilities": "device-request-driver",
        "Options": "device-request-driver",
    },
    "ExecConfig": {
        "User": FREE,
        "Privileged": "privileged",
        "Tty": FREE,
        "ConsoleSize": FREE,
        "AttachStdin": FREE,
        "AttachStderr": FREE,
        "AttachStdout": FREE,
        "Detach": FREE,
        "DetachKeys": FREE,
        "Env": FREE,
        "WorkingDir": FREE,
        "Cmd": FREE,
    },
    "Mount": {
        "Type": "mount-type",
        "Source": "bind-root",
        "Target": FREE,
        "ReadOnly": FREE,
        "Consistency": FREE,
        "BindOptions": NESTED,
        "VolumeOptions": NESTED,
        "ImageOptions": NESTED,
        "TmpfsOptions": NESTED,
        "ClusterOptions": "mount-type",
    },
    "BindOptions": {
        "Propagation": "mount-propagation",
        "NonRecursive": FREE,
        "CreateMountpoint": FREE,  # sources must exist to be pinned
        "ReadOnlyNonRecursive": FREE,
        "ReadOnlyForceRecursive": FREE,
    },
    "VolumeOptions": {"NoCopy": FREE, "Labels": FREE, "Subpath": "volume-subpath", "DriverConfig": NESTED},
    "Driver": {"Name": "volume-driver", "Options": "volume-type"},
    "ImageOptions": {"Subpath": FREE},  # inside an image's own filesystem
    "TmpfsOptions": {"SizeBytes": FREE, "Mode": FREE, "Options": "tmpfs-option"},
    "ClusterOptions": {},
    "VolumeCreateOptions": {
        "ClusterVolumeSpec": "swarm",
        "Driver": "volume-driver",
        "DriverOpts": "volume-type",
        "Labels": FREE,
        "Name": FREE,
    },
    "NetworkCreateRequest": {
        "Name": FREE,
        "CheckDuplicate": FREE,
        "Driver": "network-driver",
        "Scope": "network-driver",
        "Internal": FREE,
        "Attachable": FREE,
        "Ingress": "network-driver",
        "ConfigOnly": "network-driver",
        "ConfigFrom": "network-driver",
        "IPAM": NESTED,
        "EnableIPv4": FREE,
        "EnableIPv6": FREE,
        "Options": "network-option",
        "Labels": FREE,
    },
    "IPAM": {"Driver": "network-driver", "Config": "network-subnet", "Options": FREE},
    "AuthConfig": {
        "username": FREE,
        "password": FREE,
        "auth": FREE,
        "email": FREE,
        "serveraddress": "fetch-address",
        "identitytoken": FREE,
        "registrytoken": FREE,
    },
}

# Fields the swagger documents that the daemon's Go struct does not have (the daemon ignores them;
# in a strict struct the gate refuses them when set, as fields it cannot check).
NOT_IN_DAEMON_STRUCT = frozenset({("UpdateConfig", "Init")})
