"""A real OpenSSH server for tests: the distribution's `sshd` on a loopback port, with its own keys.

    reason = sshd_unavailable()             # None when sshd can run here (root, sshd installed)
    with running_sshd(workdir) as server:   # server.port answers SSH on 127.0.0.1
        key = server.authorize("lab", path_prefix=bin_dir)   # a client key for one machine

Nothing of the system's ssh setup is used: the config, host key, authorized keys and pid file all
live in `workdir`. Each authorized key can carry its own PATH (`environment=` in authorized_keys),
so two simulated machines on one server each see their own stand-in tools.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sshd_path() -> str | None:
    return next((c for c in SSHD_CANDIDATES if os.access(c, os.X_OK)), None) or shutil.which("sshd")


def sshd_unavailable() -> str | None:
    """Why a test sshd cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "a test sshd serves root logins, so the tests run as root"
    if sshd_path() is None or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "OpenSSH (sshd, ssh, ssh-keygen) is not installed: run .ci/install-ssh.sh"
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def keygen(path: Path, comment: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


@dataclass
class Sshd:
    workdir: Path
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    keys: dict[str, Path] = field(default_factory=dict)

    @property
    def config(self) -> Path:
        return self.workdir / "sshd_config"

    @property
    def host_key(self) -> Path:
        return self.workdir / "host_ed25519"

    @property
    def authorized_keys(self) -> Path:
        return self.workdir / "authorized_keys"

    @property
    def address(self) -> str:
        return f"root@127.0.0.1:{self.port}"

    def authorize(self, name: str, path_prefix: Path | None = None) -> Path:
        """A new client key for `name`, allowed in; its sessions get `path_prefix` first on PATH."""
        key = keygen(self.workdir / f"client_{name}", f"rdc-test-{name}")
        public = key.with_name(key.name + ".pub").read_text(encoding="utf-8").strip()
        path = f"{path_prefix}:{BASE_PATH}" if path_prefix else BASE_PATH
        with self.authorized_keys.open("a", encoding="utf-8") as handle:
            handle.write(f'environment="PATH={path}" {public}\n')
        self.keys[name] = key
        return key

    def write_config(self) -> None:
        self.authorized_keys.touch(mode=0o600)
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {self.host_key}",
            f"PidFile {self.workdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitUserEnvironment PATH",
            "MaxSessions 64",
            "MaxStartups 64:30:128",
            "LogLevel ERROR",
        ]
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def start(self) -> None:
        binary = sshd_path()
        assert binary is not None
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        log = (self.workdir / "sshd.log").open("ab")
        self.process = subprocess.Popen(
            [binary, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log, start_new_session=True
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.workdir / 'sshd.log').read_text(errors='replace')}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not listen within 10s")

    def stop(self) -> None:
        """Stop the server and every connection it serves (the commands they started go on)."""
        if self.process is None:
            return
        for pid in [*sshd_descendants(self.process.pid), self.process.pid]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        self.process = None


def sshd_descendants(pid: int) -> list[int]:
    """The sshd processes below `pid` (one per connection, and their privilege-separated children)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
        names[int(entry.name)] = name
    found, queue = [], [pid]
    while queue:
        for child in children.get(queue.pop(), []):
            queue.append(child)
            if names.get(child) == "sshd":
                found.append(child)
    return found


@contextmanager
def running_sshd(workdir: Path) -> Iterator[Sshd]:
    workdir.mkdir(parents=True, exist_ok=True)
    server = Sshd(workdir, free_port())
    keygen(server.host_key, "rdc-test-host")
    server.write_config()
    server.start()
    try:
        yield server
    finally:
        server.stop()
