"""The client-agent protocol: JSON lines over the SSH channel, versioned by `v`.

The client sends one request line:

    {"v": 1, "op": "run", "machine": "gpu1", "root": "/", "argv": [...], "columns": 120, "tty": true,
     "versions": {"rediacc-core": "0.1.0", "rediacc-example": "0.1.0"}}

(`tty`: the client's stderr is a terminal, so long steps may show progress on it; `op` "versions"
asks only for the agent's versions). The agent answers with lines, in order:
`{"started": pid}` once the command runs, `{"out": text}` and `{"err": text}` chunks as the command
writes them, then `{"exit": code}`.
A version skew is answered with `{"skew": {...machine's versions...}}` before the exit.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping
from typing import IO, Any

VERSION = 1
CORE_DISTRIBUTION = "rediacc-core"
# Plugins are the distributions registering in these entry-point groups (hooks, the demo's layouts);
# spelled out rather than imported, which would load pluggy and the demo (a test keeps them equal).
PLUGIN_GROUPS = ("rediacc", "rediacc.demo")


class ProtocolError(Exception):
    """A line that is not the protocol (an old agent, a shell's banner, a crash's output)."""


def versions() -> dict[str, str]:
    """The installed rediacc-core and plugin distributions and their versions."""
    with _INSTALLED_LOCK:  # `--all`'s threads ask at once: one reads, the others wait for it
        return dict(_installed())


_INSTALLED_LOCK = threading.Lock()


@functools.cache
def _installed() -> tuple[tuple[str, str], ...]:
    # Once per process: reading every distribution's metadata costs tens of ms, and `--all` asks
    # for each machine. A process never sees a new install (the resident agent restarts for one).
    from importlib import metadata  # here: only a command that reaches an SSH machine asks

    found = {CORE_DISTRIBUTION: metadata.version(CORE_DISTRIBUTION)}
    for group in PLUGIN_GROUPS:
        for ep in metadata.entry_points(group=group):
            if ep.dist is not None:
                found[ep.dist.name] = ep.dist.version
    return tuple(sorted(found.items()))


def skew_text(client: Mapping[str, str], machine: Mapping[str, str]) -> str:
    parts = []
    for name in sorted(set(client) | set(machine)):
        here, there = client.get(name), machine.get(name)
        if here != there:
            parts.append(f"{name} {here or 'absent'} here, {there or 'absent'} on the machine")
    return "; ".join(parts)


def encode(message: Mapping[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError as exc:
        raise ProtocolError(line.decode(errors="replace").strip()[:300]) from exc
    if not isinstance(message, dict):
        raise ProtocolError(line.decode(errors="replace").strip()[:300])
    return message


def request(op: str, **fields: Any) -> dict[str, Any]:
    return {"v": VERSION, "op": op, **fields}


class Sender:
    """Writes answer lines from any thread; once the client is gone, the rest is dropped quietly.

    A dropped connection must not stop a command half way: it finishes (or fails) whole on the
    machine under its locks, and nobody is left to tell. A command that only reads (a listing, a
    followed log) is stopped instead.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.gone = False
        self.stop_when_gone = False  # set for commands that only read: nobody is left to read to

    def send(self, message: Mapping[str, Any]) -> None:
        with self.lock:
            if not self.gone:
                try:
                    self.stream.write(encode(message))
                    self.stream.flush()
                except OSError:
                    self.gone = True
            if self.gone and self.stop_when_gone:
                raise BrokenPipeError("the client is gone")
