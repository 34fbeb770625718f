"""The system OpenSSH client, run per command with a shared master connection and rdc's own host keys.

Plain `ssh` is called so `~/.ssh/config`, ssh-agent and ProxyJump all apply. Host keys live in a
known_hosts file of rdc's own (next to the config file), one entry per machine under the alias
`rdc.<machine>`; `StrictHostKeyChecking=yes` refuses unknown and changed keys, and `rdc machine
trust` is the only way a key gets in. A master connection per machine (ControlMaster, kept
ControlPersist seconds after the last command) makes a warm command one round trip.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from rediacc_core.errors import EXIT_TOOL, RdcError, StateError, ToolError
from rediacc_core.files import atomic_write_text
from rediacc_core.remote.address import SshAddress

CONTROL_DIR_ENV = "RDC_SSH_CONTROL_DIR"
PERSIST_SECONDS = 300
CONNECT_TIMEOUT = 10
EXIT_UNREACHABLE = EXIT_TOOL


def control_dir() -> Path:
    """Private to this user: the master sockets give whoever can open them a shell on the machine."""
    env = os.environ.get(CONTROL_DIR_ENV)
    if env:
        path = Path(env)
    else:
        base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
        path = Path(base) / f"rediacc-ssh-{os.getuid()}"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class SshMachine:
    """How to reach one machine: its name (for messages and its host key) and its address."""

    name: str
    address: SshAddress
    known_hosts: Path

    @property
    def alias(self) -> str:
        return f"rdc.{self.name}"

    def control_path(self) -> Path:
        # One master per machine (not per host), so each keeps the identity and key it was added with;
        # hashed because a Unix socket path must stay under 108 bytes.
        key = f"{self.name}\0{self.address}\0{self.address.identity or ''}\0{self.known_hosts}"
        return control_dir() / hashlib.sha256(key.encode()).hexdigest()[:20]

    def options(
        self,
        *,
        known_hosts: Path | None = None,
        strict: str = "yes",
        master: bool = True,
        control_path: Path | None = None,
    ) -> list[str]:
        """ssh's options for this machine: through the shared master connection, or without one, or
        with the control socket `control_path` of a master of its own (a tunnel's; the call that
        opens it adds `ControlMaster=yes`). ssh keeps the first value it is given for an option, so
        no option set here may be given again after these."""
        opts = {
            "BatchMode": "yes",
            "HostKeyAlias": self.alias,
            "StrictHostKeyChecking": strict,
            "UserKnownHostsFile": str(known_hosts or self.known_hosts),
            "GlobalKnownHostsFile": "/dev/null",
            "HashKnownHosts": "no",  # entries are found by their alias
            "ConnectTimeout": str(CONNECT_TIMEOUT),
            "ServerAliveInterval": "5",
            "ServerAliveCountMax": "3",
            "LogLevel": "ERROR",
        }
        if master:
            opts |= {
                "ControlMaster": "auto",
                "ControlPath": str(self.control_path()),
                "ControlPersist": str(PERSIST_SECONDS),
            }
        elif control_path is not None:
            opts["ControlPath"] = str(control_path)
        else:
            opts["ControlMaster"] = "no"
            opts["ControlPath"] = "none"
        argv: list[str] = []
        for key, value in opts.items():
            argv += ["-o", f"{key}={value}"]
        if self.address.port:
            argv += ["-p", str(self.address.port)]
        if self.address.user:
            argv += ["-l", self.address.user]
        if self.address.identity:
            argv += ["-i", self.address.identity, "-o", "IdentitiesOnly=yes"]
        return argv

    def argv(self, remote_command: str) -> list[str]:
        return ["ssh", "-T", *self.options(), "--", self.address.host, remote_command]

    # --- host keys ------------------------------------------------------------------------------
    def trusted_keys(self) -> list[str]:
        try:
            lines = self.known_hosts.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [line for line in lines if line.split(" ", 1)[0] == self.alias]

    def scan_keys(self) -> list[str]:
        """The host keys the machine presents now, as known_hosts lines under this machine's alias.

        Asked through ssh itself (not ssh-keyscan) so ~/.ssh/config and ProxyJump apply; the
        connection goes no further than recording the key in a throw-away file.
        """
        with tempfile.TemporaryDirectory(prefix="rdc-hostkey-") as tmp:
            scratch = Path(tmp) / "known_hosts"
            argv = ["ssh", "-T", *self.options(known_hosts=scratch, strict="accept-new", master=False)]
            argv += ["-o", "PreferredAuthentications=none", "--", self.address.host, "true"]
            try:
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=CONNECT_TIMEOUT + 5)
            except FileNotFoundError as exc:
                raise no_ssh_client() from exc
            except subprocess.TimeoutExpired as exc:
                raise unreachable(self, f"no answer within {CONNECT_TIMEOUT + 5}s") from exc
            lines = scratch.read_text(encoding="utf-8").splitlines() if scratch.exists() else []
            if not lines:
                raise classify(self, proc.returncode, proc.stderr)
            return [line for line in lines if line.strip()]

    def remember_keys(self, lines: Sequence[str]) -> None:
        """Replace this machine's entries in rdc's known_hosts with `lines`, atomically."""
        try:
            kept = self.known_hosts.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            kept = []
        kept = [line for line in kept if line.split(" ", 1)[0] != self.alias]
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.known_hosts, "\n".join([*kept, *lines]) + "\n", mode=0o600)

    def forget_keys(self) -> None:
        if self.trusted_keys():
            self.remember_keys([])

    def close_master(self) -> None:
        if self.control_path().exists():
            subprocess.run(
                ["ssh", *self.options(), "-O", "exit", "--", self.address.host],
                capture_output=True,
                timeout=10,
                check=False,
            )


def fingerprints(lines: Sequence[str]) -> list[str]:
    """`ssh-keygen -lf` of known_hosts lines: `SHA256:… (ED25519)` each."""
    with tempfile.NamedTemporaryFile("w", prefix="rdc-keys-", suffix=".txt") as handle:
        handle.write("\n".join(lines) + "\n")
        handle.flush()
        try:
            proc = subprocess.run(
                ["ssh-keygen", "-lf", handle.name], capture_output=True, text=True, check=False
            )
        except FileNotFoundError as exc:
            raise no_ssh_client() from exc
    found = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            found.append(f"{parts[1]} {parts[-1]}")
    return found


@contextmanager
def stderr_file() -> Iterator[IO[bytes]]:
    # A file, not a pipe: a master connection that ssh leaves running would hold a pipe open.
    with tempfile.TemporaryFile(prefix="rdc-ssh-") as handle:
        yield handle


# --- what ssh's failures mean ---------------------------------------------------------------------


def no_ssh_client() -> ToolError:
    return ToolError(
        "the OpenSSH client (ssh) is not installed", "install it, e.g. apt-get install openssh-client"
    )


def unreachable(machine: SshMachine, why: str) -> ToolError:
    return ToolError(
        f"cannot reach machine {machine.name} at {machine.address}: {why}",
        f"check that the host is up and sshd answers: {try_command(machine)}",
    )


def try_command(machine: SshMachine) -> str:
    """The plain `ssh` line that logs in as rdc does, for the user to try by hand."""
    address = machine.address
    argv = ["ssh"]
    if address.port:
        argv += ["-p", str(address.port)]
    if address.identity:
        argv += ["-i", shlex.quote(address.identity)]
    argv.append(f"{address.user}@{address.host}" if address.user else address.host)
    return " ".join([*argv, "true"])


def key_unknown(machine: SshMachine) -> StateError:
    return StateError(
        f"the host key of machine {machine.name} ({machine.address}) is not trusted yet",
        f"check its fingerprint and accept it: rdc machine trust {machine.name}",
    )


def changed_key(machine: SshMachine) -> StateError:
    """A host key other than the trusted one: both fingerprints, and the only way to accept it."""
    old = ", ".join(fingerprints(machine.trusted_keys())) or "none"
    try:
        new = ", ".join(fingerprints(machine.scan_keys()))
    except RdcError:
        new = "unknown (the machine did not show it again)"
    return StateError(
        f"the host key of machine {machine.name} ({machine.address}) has CHANGED since it was trusted; "
        f"refusing to connect (someone may be intercepting the connection). Trusted: {old}; "
        f"presented now: {new}",
        "if the machine was reinstalled, check the new fingerprint with its operator, then accept exactly "
        f"that key: rdc machine trust {machine.name} --fingerprint SHA256:…",
    )


_MISSING_IDENTITY = re.compile(r"Identity file (?P<path>.+?) not accessible")


def classify(machine: SshMachine, returncode: int, stderr: str) -> RdcError:
    """The RdcError for ssh's own failure (exit 255) or a remote shell's."""
    text = stderr.strip()
    last = text.splitlines()[-1] if text else f"ssh exited with {returncode}"
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in text or ("Host key for" in text and "has changed" in text):
        return changed_key(machine)
    if "Host key verification failed" in text or ("No " in text and "host key is known" in text):
        return key_unknown(machine)
    missing = _MISSING_IDENTITY.search(text)
    if missing is not None:
        return RdcError(
            f"the key file of machine {machine.name}, {missing['path']}, does not exist or cannot be read "
            f"(ssh: {last})",
            f"restore it, or register the machine again with the right key: rdc machine remove "
            f"{machine.name}, then rdc machine add {machine.name} --ssh {machine.address} --identity FILE",
            exit_code=EXIT_UNREACHABLE,
        )
    if "Permission denied" in text or "Too many authentication failures" in text:
        return RdcError(
            f"machine {machine.name} ({machine.address}) refused the login: {last}",
            "check the user and key: ssh-add -l, the --identity the machine was added with, and the "
            f"machine's authorized_keys; try it by hand: {try_command(machine)}",
            exit_code=EXIT_UNREACHABLE,
        )
    if "Could not resolve hostname" in text:
        return ToolError(
            f"the host of machine {machine.name}, {machine.address.host}, is not known here: {last}",
            "check the name (DNS, /etc/hosts, a Host of ~/.ssh/config), or register the machine by its "
            "address",
        )
    return unreachable(machine, last)
