"""Image configuration lookups for the decider, straight from the repo's daemon socket.

Request rules sometimes need what an image declares (its environment, for example). Asking the
daemon waits, so it never happens on the gate's event loop: a decision the gate tried inline
moves to a worker thread the moment it asks (`may_block`), and there a blocking HTTP request
over the daemon's Unix socket is fine. An image id names immutable content, so answers are
cached by id; a name (`repo:tag`) is looked up every time, because tags move.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rediacc_core import unixhttp
from rediacc_core.blocking import may_block

LOOKUP_TIMEOUT = 5.0
_CACHE_MAX = 512


def _is_image_id(ref: str) -> bool:
    digest = ref.removeprefix("sha256:")
    return len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)


class ImageConfigs:
    """`image_config(ref)`: the `Config` object of an image in the daemon, or None when unknown.

    None also stands for "could not ask" (daemon slow or down); callers decide what that means.
    """

    def __init__(self, upstream: Path, timeout: float = LOOKUP_TIMEOUT) -> None:
        self.upstream = upstream
        self.timeout = timeout
        self._by_id: dict[str, Mapping[str, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, ref: str) -> Mapping[str, Any] | None:
        if not ref:
            return None
        key = ref if ref.startswith("sha256:") else f"sha256:{ref}"
        if _is_image_id(ref):
            with self._lock:
                cached = self._by_id.get(key)
            if cached is not None:
                return cached
        may_block()  # asking the daemon waits: not on the gate's event loop
        document = self._inspect(ref)
        if document is None:
            return None
        config = document.get("Config")
        config = config if isinstance(config, dict) else {}
        image_id = document.get("Id")
        if isinstance(image_id, str):
            with self._lock:
                if len(self._by_id) >= _CACHE_MAX:
                    self._by_id.clear()
                self._by_id[image_id] = config
        return config

    def _inspect(self, ref: str) -> dict[str, Any] | None:
        target = f"/images/{urllib.parse.quote(ref, safe='/:@')}/json"
        try:
            status, body = unixhttp.request(self.upstream, "GET", target, timeout=self.timeout)
            if status != 200:
                return None
            document = json.loads(body)
        except (OSError, http.client.HTTPException, ValueError):
            return None
        return document if isinstance(document, dict) else None
