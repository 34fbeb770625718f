"""The CDI names a container asks for, read from its HostConfig as the daemon reads them.

A container holds the CDI names of its `HostConfig.DeviceRequests` with driver `cdi`: the daemon
injects them at every start. The gate reads them from a create body, the runtime from the daemon's
own record of a container (its inspect document): one reading for both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cdi_names(host_config: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every device id in the CDI device requests of a HostConfig (or update body), once each."""
    names: list[str] = []
    requests = host_config.get("DeviceRequests") if isinstance(host_config, Mapping) else None
    for request in requests if isinstance(requests, list) else ():
        if isinstance(request, dict) and request.get("Driver") == "cdi":
            ids = request.get("DeviceIDs")
            names.extend(i for i in (ids if isinstance(ids, list) else ()) if isinstance(i, str))
    return tuple(dict.fromkeys(names))
