"""Docker from the laptop: a local Unix socket forwarded by OpenSSH to a remote repo's gate socket.

The docker CLI's own `ssh://` DOCKER_HOST would run `docker system dial-stdio` on the machine,
which talks to the machine's default daemon, not to the repo's gate; so `rdc` forwards the gate's
socket instead. Each tunnel is an `ssh -f -N -L` of its own with a control socket beside the local
socket, so it can be checked and closed, and it lives until closed (not just ControlPersist).
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from rediacc_core.config import Config
from rediacc_core.errors import RdcError, StateError, ToolError
from rediacc_core.machine import Machine
from rediacc_core.remote.dispatch import Stream, run_remote, ssh_machine
from rediacc_core.remote.ssh import CONNECT_TIMEOUT, classify, control_dir, key_unknown, stderr_file


def _machine_prefix(machine: Machine) -> str:
    """What every tunnel socket of `machine` starts with, so they can all be found and closed."""
    return "gate-" + hashlib.sha256(f"{machine.name}\0{machine.remote}".encode()).hexdigest()[:12]


def local_socket(machine: Machine, ref: str) -> Path:
    digest = hashlib.sha256(ref.encode()).hexdigest()[:12]
    return control_dir() / f"{_machine_prefix(machine)}-{digest}.sock"


def _control(socket: Path) -> Path:
    return socket.with_suffix(".ctl")


def remote_gate_socket(config: Config, machine: Machine, ref: str) -> str:
    """The gate socket of `ref` on the machine, as `rdc repo docker-host` prints it there."""
    out, err = Stream(), Stream()
    code = run_remote(config, machine, ["repo", "docker-host", ref], out, err)
    if code != 0:
        message = err.value().strip()
        what = message.splitlines()[0].removeprefix("Error: ") if message else f"exit {code}"
        raise RdcError(what, f"check the repo: rdc repo list {machine.name}", exit_code=code)
    url = out.value().strip()
    if not url.startswith("unix://"):
        raise StateError(f"repo {ref} answers with DOCKER_HOST {url!r}, which cannot be forwarded")
    return url.removeprefix("unix://")


def is_open(config: Config, machine: Machine, socket: Path) -> bool:
    ssh = ssh_machine(config, machine)
    argv = ["ssh", *ssh.options(master=False, control_path=_control(socket)), "-O", "check"]
    proc = subprocess.run([*argv, "--", ssh.address.host], capture_output=True, timeout=10, check=False)
    return proc.returncode == 0 and socket.exists()


def open_tunnel(config: Config, machine: Machine, ref: str) -> Path:
    """The local socket forwarded to `ref`'s gate on the machine, opened now unless it is open already."""
    socket = local_socket(machine, ref)
    if is_open(config, machine, socket):
        return socket
    ssh = ssh_machine(config, machine)
    if not ssh.trusted_keys():
        raise key_unknown(ssh)
    remote = remote_gate_socket(config, machine, ref)
    argv = ["ssh", "-f", "-N", *ssh.options(master=False, control_path=_control(socket))]
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
        f"{socket}:{remote}",
        "--",
        ssh.address.host,
    ]
    with stderr_file() as errfile:
        try:
            proc = subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=errfile, stderr=errfile, timeout=CONNECT_TIMEOUT + 20
            )
        except subprocess.TimeoutExpired as exc:
            raise ToolError(f"the tunnel to machine {machine.name} did not open", "try again") from exc
        errfile.seek(0)
        output = errfile.read().decode(errors="replace")
    if proc.returncode != 0:
        raise classify(ssh, proc.returncode, output)
    return socket


def close_tunnel(config: Config, machine: Machine, ref: str) -> bool:
    return _close(config, machine, local_socket(machine, ref))


def close_all(config: Config, machine: Machine) -> int:
    """Close every tunnel open to `machine` (when it is removed); returns how many there were."""
    controls = sorted(control_dir().glob(f"{_machine_prefix(machine)}-*.ctl"))
    return sum(_close(config, machine, control.with_suffix(".sock")) for control in controls)


def _close(config: Config, machine: Machine, socket: Path) -> bool:
    if not _control(socket).exists():
        return False
    ssh = ssh_machine(config, machine)
    argv = [
        "ssh",
        *ssh.options(master=False, control_path=_control(socket)),
        "-O",
        "exit",
    ]
    subprocess.run([*argv, "--", ssh.address.host], capture_output=True, timeout=10, check=False)
    socket.unlink(missing_ok=True)
    return True
