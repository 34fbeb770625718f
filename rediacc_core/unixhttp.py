"""The one HTTP client over a Unix socket: for the runtime (pings, image lookups) and the test kit.

`http.client` does the HTTP; only the connection is a Unix socket. (bench/uds.py keeps its own raw
client on purpose: it pipelines, hijacks and times bytes the way a load generator must.)
"""

from __future__ import annotations

import http.client
import socket
from pathlib import Path


class UnixHTTPConnection(http.client.HTTPConnection):
    """An `http.client.HTTPConnection` to the daemon (or gate) listening on `path`."""

    def __init__(self, path: Path | str, timeout: float | None = 60.0) -> None:
        super().__init__("docker", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def request(
    path: Path | str,
    method: str,
    target: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> tuple[int, bytes]:
    """One request on a fresh connection: (status, body). OSError and HTTPException propagate."""
    conn = UnixHTTPConnection(path, timeout)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def listening(path: Path, timeout: float = 1.0) -> bool:
    """Whether something accepts connections on the Unix socket `path` now (it is sent nothing)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True
