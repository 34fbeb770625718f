"""What a read endpoint shows a tenant: its own world, not the machine's.

Docker Engine 28 (API 1.50+) lists in `GET /info` every CDI device its spec directories define
(`DiscoveredDevices`): every GPU of the machine, granted to this repo or not, and the names another
repo holds. The gate answers `/info` itself: it asks the daemon, keeps of `DiscoveredDevices` the
names this repo may use now, and sends that. Every other read endpoint shows only the repo's own
daemon (SECURITY.md, "What read endpoints show").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Any

# A view of a read's answer (`endpoints.Route.view`): the daemon's JSON document as a repo that
# holds these grants may see it.
View = Callable[[Any, Collection[str]], Any]


def info_for_repo(document: Any, granted: Collection[str]) -> Any:
    """`/info`'s document with the CDI devices cut to `granted` (other entries as the daemon sent)."""
    if not isinstance(document, dict):
        return document
    devices = document.get("DiscoveredDevices")
    if isinstance(devices, list):
        document = {
            **document,
            "DiscoveredDevices": [
                d
                for d in devices
                if isinstance(d, dict) and d.get("Source") == "cdi" and d.get("ID") in granted
            ],
        }
    return document


def _granted_cdi(device: object, granted: Collection[str]) -> bool:
    return isinstance(device, dict) and device.get("Source") == "cdi" and device.get("ID") in granted


def seen_through(view: View, raw: bytes, granted: Collection[str]) -> bytes:
    """The daemon's JSON answer `raw` as this repo may see it through `view`; ValueError when it is
    not JSON."""
    return (json.dumps(view(json.loads(raw), granted)) + "\n").encode()


def info_body(raw: bytes, granted: Collection[str]) -> bytes:
    """The daemon's `/info` body as this repo may see it; ValueError when it is not JSON."""
    return seen_through(info_for_repo, raw, granted)
