"""The client's way to a machine's resident agent: a local Unix socket its SSH master forwards there.

`ssh -O forward -L LOCAL:REMOTE` asks the running master connection to forward the socket, so a
command reaches the resident agent with one `connect()`: no ssh process, no login, no Python start on
the machine. The forward lives as long as the master (ControlPersist). The local socket is named from
the master's control socket (itself a hash of the machine's name, address, identity and known_hosts)
and the machine root, so it leads only where its master leads; it sits in the private control
directory with mode 0600 (StreamLocalBindMask), as the master's own socket does.

`exchange` answers None whenever nothing came back (no forward yet, the master gone, no resident
listening, a resident that asks to be restarted): nothing ran, and the caller runs the command the
one-shot way, which starts a resident and says where it listens.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rediacc_core.remote import protocol
from rediacc_core.remote.ssh import SshMachine, control_dir

IDLE_ENV = "RDC_AGENT_IDLE"
DEFAULT_IDLE = 300.0


def idle_seconds() -> float:
    """How long a resident agent waits for the next command; 0 turns resident agents off."""
    try:
        return max(0.0, float(os.environ.get(IDLE_ENV, DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def local_socket(ssh: SshMachine, root: str) -> Path:
    key = f"{ssh.control_path()}\0{root}"
    return control_dir() / f"agent-{hashlib.sha256(key.encode()).hexdigest()[:20]}.sock"


def exchange(
    ssh: SshMachine, root: str, request: dict[str, Any], take: Callable[[bytes], dict[str, Any] | None]
) -> bool:
    """Send `request` to the resident agent and feed each answer line to `take` (which returns the
    decoded message); False when the agent was not reached and nothing ran."""
    path = local_socket(ssh, root)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        conn.sendall(protocol.encode(request))
    except OSError:
        conn.close()
        return False
    answered = False
    with conn, conn.makefile("rb") as lines:
        try:
            for line in lines:
                message = take(line)
                if message is not None and "restart" in message:
                    return False
                answered = True
        except OSError:
            pass  # a connection reset mid-way: whatever arrived says how far it went
    return answered


def forward(ssh: SshMachine, root: str, remote: str) -> None:
    """Have the master forward this machine's local agent socket to `remote`; quietly nothing when
    it cannot (the next command then runs the one-shot way again)."""
    path = local_socket(ssh, root)
    path.unlink(missing_ok=True)  # a forward of a master that is gone
    argv = ["ssh", *ssh.options(), "-O", "forward", "-L", f"{path}:{remote}", "--", ssh.address.host]
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return


def forget(ssh: SshMachine, root: str) -> None:
    """Drop the forward (machine removed or re-registered): its socket file goes with it."""
    local_socket(ssh, root).unlink(missing_ok=True)
