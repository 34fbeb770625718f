"""Who is at the other end of a gate connection: the client process as the kernel recorded it (SO_PEERCRED),
and for a connection sshd forwarded, the SSH user and client behind it (`sshpeer`)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from rediacc_core.gate.audit.sshpeer import ssh_client


@dataclass(frozen=True, slots=True)
class Peer:
    """The client process of a connection, as the kernel recorded it when it connected."""

    pid: int
    uid: int
    gid: int
    ssh: tuple[str, str] | None = None  # (user, client address) when sshd forwarded the connection

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"pid": self.pid, "uid": self.uid, "gid": self.gid}
        if self.ssh is not None:
            found["ssh"] = {"user": self.ssh[0], "client": self.ssh[1]}
        return found


NO_PEER = Peer(0, -1, -1)


def peer_of(transport: Any) -> Peer:
    """SO_PEERCRED of a Unix-socket transport; `NO_PEER` where it cannot be read."""
    sock = transport.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (AttributeError, OSError):
        return NO_PEER
    pid, uid, gid = struct.unpack("3i", raw)
    found = ssh_client(pid, uid)  # a tunnelled request: name the SSH client, not only sshd
    return Peer(pid, uid, gid, None if found is None else (found["user"], found.get("client", "?")))
