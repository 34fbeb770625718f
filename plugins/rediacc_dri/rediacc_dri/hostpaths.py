"""Which host paths a request's raw `HostConfig.Devices` entries really name.

The daemon cleans `PathOnHost` and follows symlinks before it opens the node (a directory gives
every node under it), so a rule must judge the path it lands on, not the text it was given.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from rediacc_core import ApiRequest
from rediacc_core.cdi.names import is_qualified_name
from rediacc_core.machine import Machine

CONTAINER_UPDATE = re.compile(r"^/containers/[^/]+/update$")
MAX_LINKS = 40  # as the kernel's own limit on nested symlinks


def raw_device_paths(request: ApiRequest) -> list[str]:
    """`PathOnHost` of every raw device entry; CDI names (Compose's legacy form) are not raw."""
    body = request.body
    if not isinstance(body, Mapping) or request.method != "POST":
        return []
    devices: Any = None
    if request.is_container_create:
        host_config = body.get("HostConfig")
        devices = host_config.get("Devices") if isinstance(host_config, Mapping) else None
    elif CONTAINER_UPDATE.match(request.path):
        devices = body.get("Devices")
    if not isinstance(devices, list):
        return []
    paths = []
    for entry in devices:
        path = entry.get("PathOnHost") if isinstance(entry, Mapping) else None
        if isinstance(path, str) and path and not is_qualified_name(path):
            paths.append(path)
    return paths


def clean(path: str) -> str:
    """The path as the daemon's `filepath.Clean` leaves it; relative paths start at `/`."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def resolve(machine: Machine, path: str) -> str:
    """`path` with every symlink followed inside the machine root, as the daemon would on the host."""
    pending = [part for part in clean(path).split("/") if part]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        if part == ".":
            continue
        here = "/" + "/".join([*done, part])
        host = machine.path(here)
        if not host.is_symlink():
            done.append(part)
            continue
        links += 1
        if links > MAX_LINKS:
            return here  # a loop: the daemon fails on it too; judge the text
        target = os.readlink(host)
        if target.startswith("/"):
            done = []
        pending = [p for p in target.split("/") if p] + pending
    return "/" + "/".join(done)


def landing_paths(machine: Machine, raw: str) -> tuple[str, ...]:
    """The cleaned path and, when links lead elsewhere, where they lead."""
    cleaned = clean(raw)
    resolved = resolve(machine, cleaned)
    return (cleaned,) if resolved == cleaned else (cleaned, resolved)


def is_at_or_under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")
