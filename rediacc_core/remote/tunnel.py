"""Docker from the laptop: a local Unix socket forwarded by OpenSSH to a remote repo's gate socket.

The docker CLI's own `ssh://` DOCKER_HOST would run `docker system dial-stdio` on the machine,
which talks to the machine's default daemon, not to the repo's gate; so `rdc` forwards the gate's
socket instead. Each tunnel is an `ssh -f -N -L` of its own with a control socket beside the local
socket, so it can be checked and closed, and it lives until closed (not just ControlPersist).

A tunnel is keyed by what it reaches (`Far`): the client config, the machine's address, identity and
trusted host key, its root, the repo's id and the gate's path there. The socket's name is a hash of
all of it and a record beside it says what it reaches, so a machine re-registered elsewhere, a
second config with the same machine name, or a re-created repo never finds another's tunnel. A
tunnel is handed out again only while `/_ping` answers through it; any other tunnel to the same
repo of the same config is closed when a new one opens.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from http.client import HTTPException
from pathlib import Path
from typing import Any

from rediacc_core.config import Config
from rediacc_core.errors import RdcError, StateError, ToolError
from rediacc_core.files import atomic_write_text
from rediacc_core.machine import Machine
from rediacc_core.remote.agentcall import Stream, run_remote, ssh_machine
from rediacc_core.remote.ssh import (
    CONNECT_TIMEOUT,
    SshMachine,
    classify,
    control_dir,
    key_unknown,
    stderr_file,
)
from rediacc_core.unixhttp import request

PING_TIMEOUT = 5.0


@dataclass(frozen=True)
class Far:
    """Everything a tunnel leads to; two tunnels are the same only when all of it is."""

    config: str  # the client config the machine is registered in
    machine: str
    address: str
    identity: str
    host_keys: tuple[str, ...]  # the trusted keys, as known_hosts "type base64" pairs
    root: str
    ref: str
    repo_id: str
    gate: str  # the gate's socket path on the machine

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Tunnel:
    """One tunnel's local socket and the record of what it reaches."""

    socket: Path
    far: Far

    @property
    def control(self) -> Path:
        return self.socket.with_suffix(".ctl")

    @property
    def record(self) -> Path:
        return self.socket.with_suffix(".json")

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def to_json(self) -> dict[str, str]:
        """What `-o json` says of a tunnel: the repo, and DOCKER_HOST where the user is."""
        return {"repo": self.far.ref, "repoId": self.far.repo_id, "dockerHost": self.docker_host}


def socket_for(far: Far) -> Path:
    return control_dir() / f"gate-{far.key()[:24]}.sock"


def host_keys(ssh: SshMachine) -> tuple[str, ...]:
    return tuple(sorted(" ".join(line.split()[1:3]) for line in ssh.trusted_keys()))


def locate(config: Config, machine: Machine, ref: str) -> Far:
    """What a tunnel to `ref` must reach now: asked of the machine (the repo's id and gate path)."""
    out, err = Stream(), Stream()
    code = run_remote(config, machine, ["repo", "docker-host", ref, "-o", "json"], out, err)
    if code != 0:
        message = err.value().strip()
        what = message.splitlines()[0].removeprefix("Error: ") if message else f"exit {code}"
        raise RdcError(what, f"check the repo: rdc repo list {machine.name}", exit_code=code)
    try:
        answer = json.loads(out.value())
        url, repo_id, found_ref = str(answer["dockerHost"]), str(answer["repoId"]), str(answer["repo"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"machine {machine.name} did not say where repo {ref}'s gate is") from exc
    if not url.startswith("unix://"):
        raise StateError(f"repo {ref} answers with DOCKER_HOST {url!r}, which cannot be forwarded")
    assert machine.remote is not None
    return Far(
        config=str(config.path.absolute()),
        machine=machine.name,
        address=str(machine.remote),
        identity=machine.remote.identity or "",
        host_keys=host_keys(ssh_machine(config, machine)),
        root=str(machine.root),
        ref=found_ref,
        repo_id=repo_id,
        gate=url.removeprefix("unix://"),
    )


def open_tunnel(config: Config, machine: Machine, ref: str) -> Tunnel:
    """The tunnel to `ref`'s gate: the open one to exactly that gate when it answers, else a new one
    (closing whatever else of this config led to the same repo)."""
    ssh = ssh_machine(config, machine)
    if not ssh.trusted_keys():
        raise key_unknown(ssh)
    far = locate(config, machine, ref)
    wanted = Tunnel(socket_for(far), far)
    found = None
    for other in tunnels(config):
        if other.socket == wanted.socket and is_open(other) and answers(other.socket):
            found = other
        elif other.socket == wanted.socket or (other.far.machine, other.far.ref) == (far.machine, far.ref):
            close(other)  # a tunnel to what the repo was, or one whose far end is gone
    if found is not None:
        return found
    _spawn(ssh, wanted)
    atomic_write_text(wanted.record, json.dumps(asdict(far), sort_keys=True) + "\n", mode=0o600)
    return wanted


def answers(socket: Path) -> bool:
    """Whether the far end answers the Engine API's ping through the tunnel now."""
    try:
        status, _body = request(socket, "GET", "/_ping", timeout=PING_TIMEOUT)
    except (OSError, HTTPException):
        return False
    return status == 200


def is_open(tunnel: Tunnel) -> bool:
    """Whether the tunnel's ssh still runs (asked through its control socket)."""
    return tunnel.socket.exists() and _control(tunnel, "check") == 0


def _spawn(ssh: SshMachine, tunnel: Tunnel) -> None:
    argv = ["ssh", "-f", "-N", *ssh.options(master=False, control_path=tunnel.control)]
    argv += [
        "-o",
        "ControlMaster=yes",
        "-o",
        "ControlPersist=yes",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "StreamLocalBindUnlink=yes",
        "-o",
        "StreamLocalBindMask=0177",  # the socket is a way into the repo: this user only
        "-L",
        f"{tunnel.socket}:{tunnel.far.gate}",
        "--",
        ssh.address.host,
    ]
    with stderr_file() as errfile:
        try:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=errfile, stderr=errfile, timeout=CONNECT_TIMEOUT + 20
            )
        except subprocess.TimeoutExpired as exc:
            raise ToolError(f"the tunnel to machine {ssh.name} did not open", "try again") from exc
        errfile.seek(0)
        output = errfile.read().decode(errors="replace")
    if proc.returncode != 0:
        raise classify(ssh, proc.returncode, output)


# --- the tunnels of a config --------------------------------------------------------------------------


def tunnels(config: Config) -> list[Tunnel]:
    """Every tunnel this config's machines have, open or not, from the records beside the sockets."""
    mine = str(config.path.absolute())
    return [t for t in _all_records() if t.far.config == mine]


def _all_records() -> Iterator[Tunnel]:
    for record in sorted(control_dir().glob("gate-*.json")):
        try:
            data: dict[str, Any] = json.loads(record.read_text(encoding="utf-8"))
            far = Far(**{**data, "host_keys": tuple(data.get("host_keys", ()))})
        except (OSError, ValueError, TypeError):
            continue  # not one of ours, or half-written: never handed out (its name is not asked for)
        yield Tunnel(record.with_suffix(".sock"), far)


def close(tunnel: Tunnel) -> None:
    """End the tunnel's ssh (through its own control socket) and remove its files."""
    if tunnel.control.exists():
        _control(tunnel, "exit")
    for path in (tunnel.socket, tunnel.control, tunnel.record):
        path.unlink(missing_ok=True)


def _control(tunnel: Tunnel, command: str) -> int:
    # Only the control socket matters to `ssh -O`: the machine may be gone from the config by now.
    argv = ["ssh", "-o", f"ControlPath={tunnel.control}", "-O", command, "--", "rdc-tunnel"]
    return subprocess.run(argv, capture_output=True, timeout=10, check=False).returncode


def close_tunnels(config: Config, machine: str, ref: str | None = None) -> int:
    """Close this config's tunnels to `machine` (to its repo `ref` only, when given); how many."""
    closing = [t for t in tunnels(config) if t.far.machine == machine and ref in (None, t.far.ref)]
    for tunnel in closing:
        close(tunnel)
    return len(closing)


def state(tunnel: Tunnel) -> str:
    """`answers`, `no answer` (the ssh runs, the gate does not answer) or `closed`."""
    if not is_open(tunnel):
        return "closed"
    return "answers" if answers(tunnel.socket) else "no answer"
