"""Who is behind a connection that sshd forwarded to the gate (`rdc repo env` from a laptop).

SO_PEERCRED of a tunnelled request names sshd's session process, not the person: the kernel only
knows who called connect(). That process (or its privileged parent) holds the SSH connection's TCP
socket, whose far end is the SSH client; its uid is the user the client logged in as. Both are read
from /proc once per connection, and only when the peer is an sshd.
"""

from __future__ import annotations

import ipaddress
import os
import pwd
import sys
from pathlib import Path

PROC = Path("/proc")


def ssh_client(pid: int, uid: int, proc: Path = PROC) -> dict[str, str] | None:
    """`{"user": …, "client": "ADDRESS:PORT"}` when `pid` is an sshd session, else None."""
    if pid <= 0 or not _is_sshd(proc / str(pid)):
        return None
    found: dict[str, str] = {"user": _user(uid)}
    for candidate in (pid, _parent(proc / str(pid))):
        if candidate is None or not _is_sshd(proc / str(candidate)):
            continue
        client = _tcp_far_end(proc / str(candidate))
        if client is not None:
            found["client"] = client
            break
    return found


def _is_sshd(entry: Path) -> bool:
    # Read for every connection the gate accepts: one open, one read, no text layer (a third of
    # `read_text`'s time).
    try:
        fd = os.open(f"{entry}/comm", os.O_RDONLY | os.O_CLOEXEC)
        try:
            comm = os.read(fd, 64).strip()
        finally:
            os.close(fd)
    except OSError:
        return False
    return comm in (b"sshd", b"sshd-session")


def _parent(entry: Path) -> int | None:
    try:
        stat = (entry / "stat").read_text(encoding="utf-8")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _tcp_far_end(entry: Path) -> str | None:
    """The remote address of the first established TCP socket the process holds."""
    inodes = set()
    try:
        for fd in (entry / "fd").iterdir():
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return None
    for table, size in (("tcp", 4), ("tcp6", 16)):
        try:
            lines = (entry / "net" / table).read_text(encoding="utf-8").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes and fields[3] == "01":  # 01: ESTABLISHED
                return _address(fields[2], size)
    return None


def _address(hex_pair: str, size: int) -> str:
    """`/proc/net/tcp`'s `HEXADDR:HEXPORT` (the address in host order, 32-bit words) as text."""
    raw, _, port = hex_pair.partition(":")
    words = [bytes.fromhex(raw[i : i + 8]) for i in range(0, len(raw), 8)]
    packed = b"".join(w[::-1] if sys.byteorder == "little" else w for w in words)
    address = ipaddress.ip_address(packed[:size])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    shown = f"[{address}]" if isinstance(address, ipaddress.IPv6Address) else str(address)
    return f"{shown}:{int(port, 16)}"
