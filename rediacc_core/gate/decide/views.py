"""What a read endpoint shows a tenant: its own world, not the machine's.

Docker Engine 28 (API 1.50+) lists in `GET /info` every CDI device its spec directories define
(`DiscoveredDevices`): every GPU of the machine, granted to this repo or not, and the names another
repo holds. The gate answers `/info` itself: it asks the daemon, keeps of `DiscoveredDevices` the
names this repo may use now, and sends that. Every other read endpoint shows only the repo's own
daemon (SECURITY.md, "What read endpoints show").
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any


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


def info_body(raw: bytes, granted: Collection[str]) -> bytes:
    """The daemon's `/info` body as this repo may see it; ValueError when it is not JSON."""
    return (json.dumps(info_for_repo(json.loads(raw), granted)) + "\n").encode()
