"""A minimal HTTP/1.1 client over a Unix socket, for the scenarios the C load generator does not cover.

It speaks just enough HTTP for Docker's API: keep-alive, Content-Length and chunked bodies, and the
`101 UPGRADED` hijack that `docker attach` uses. The benchmark needs to hold a thousand connections
open and to see exactly what went over the wire, which `http.client` makes awkward on Unix sockets.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any


class HttpError(Exception):
    """The peer answered something that is not a well-framed HTTP/1.1 response."""


@dataclass
class Response:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body)


class Conn:
    """One keep-alive connection to a Unix socket."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_request(
        self, method: str, target: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> None:
        lines = [f"{method} {target} HTTP/1.1", "Host: docker", "User-Agent: rediacc-bench"]
        for name, value in (headers or {}).items():
            lines.append(f"{name}: {value}")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.sendall(head + (body or b""))

    def request(
        self, method: str, target: str, body: bytes | None = None, headers: dict[str, str] | None = None
    ) -> Response:
        self.send_request(method, target, body, headers)
        return self.read_response(head_only=method == "HEAD")

    def _fill(self) -> None:
        data = self.sock.recv(1 << 20)
        if not data:
            raise HttpError(f"{self.path}: connection closed mid-response")
        self._buf += data

    def read_head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self._buf:
            self._fill()
        head, self._buf = self._buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"{self.path}: bad status line {lines[0]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        return int(parts[1]), headers

    def read_response(self, head_only: bool = False) -> Response:
        status, headers = self.read_head()
        if head_only or status in (204, 304) or 100 <= status < 200:
            return Response(status, headers)
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return Response(status, headers, self._read_chunked())
        length = int(headers.get("content-length", "0"))
        while len(self._buf) < length:
            self._fill()
        body, self._buf = self._buf[:length], self._buf[length:]
        return Response(status, headers, body)

    def _read_chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            while b"\r\n" not in self._buf:
                self._fill()
            line, self._buf = self._buf.split(b"\r\n", 1)
            size = int(line.split(b";")[0], 16)
            if size == 0:
                while not (self._buf.startswith(b"\r\n") or b"\r\n\r\n" in self._buf):
                    self._fill()
                end = 2 if self._buf.startswith(b"\r\n") else self._buf.index(b"\r\n\r\n") + 4
                self._buf = self._buf[end:]
                return b"".join(parts)
            while len(self._buf) < size + 2:
                self._fill()
            parts.append(self._buf[:size])
            self._buf = self._buf[size + 2 :]

    def hijack(self, target: str) -> int:
        """Sends an attach-style upgrade request; returns the status (101 when the stream is open)."""
        self.send_request("POST", target, headers={"Connection": "Upgrade", "Upgrade": "tcp"})
        status, _ = self.read_head()
        return status

    def read_stream_frame(self) -> tuple[int, bytes]:
        """One frame of Docker's multiplexed attach stream: (stream number, payload)."""
        while len(self._buf) < 8:
            self._fill()
        stream, size = self._buf[0], int.from_bytes(self._buf[4:8], "big")
        while len(self._buf) < 8 + size:
            self._fill()
        payload, self._buf = self._buf[8 : 8 + size], self._buf[8 + size :]
        return stream, payload


def call(path: str, method: str, target: str, body: Any = None, timeout: float = 60.0) -> Response:
    """One request on a fresh connection; `body` is sent as JSON when it is not bytes."""
    data: bytes | None
    headers = {}
    if body is None or isinstance(body, bytes):
        data = body
    else:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    with Conn(path, timeout) as conn:
        return conn.request(method, target, data, headers)


def wait_until_answers(path: str, deadline_s: float, what: str) -> None:
    """Waits until `GET /_ping` on `path` answers 200, or raises naming `what` and the last error."""
    end = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < end:
        try:
            if call(path, "GET", "/_ping", timeout=2).status == 200:
                return
            last = "non-200 answer to /_ping"
        except (OSError, HttpError) as exc:
            last = str(exc)
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer on {path} within {deadline_s:.0f}s ({last})")
