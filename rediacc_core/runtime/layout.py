"""Where one private daemon keeps everything: its working directory (socket, pidfile, exec-root,
config, log) and its data root, with its own containerd laid out as dockerd would lay out the one it
supervises. Kept short: Unix socket paths are limited to 107 bytes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rediacc_core.runtime.process import Child

SOCKET_PATH_MAX = 107  # sun_path is 108 bytes including the terminating NUL
# The deepest socket dockerd creates below its exec-root (its managed containerd's ttrpc socket).
_EXEC_ROOT_SOCKET_TAIL = len("/containerd/containerd.sock.ttrpc")


@dataclass(frozen=True)
class DaemonPaths:
    """Where one private daemon keeps everything."""

    workdir: Path
    data_root: Path

    @property
    def socket(self) -> Path:
        return self.workdir / "docker.sock"

    @property
    def pidfile(self) -> Path:
        return self.workdir / "dockerd.pid"

    @property
    def exec_root(self) -> Path:
        return self.workdir / "exec"

    @property
    def config(self) -> Path:
        return self.workdir / "daemon.json"

    @property
    def log(self) -> Path:
        return self.workdir / "dockerd.log"

    @property
    def guard_script(self) -> Path:
        return self.workdir / "runtime-guard"

    # The daemon's own containerd (`runtime.containerd`), where dockerd would put a supervised one.
    @property
    def containerd_socket(self) -> Path:
        return self.exec_root / "containerd" / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.exec_root / "containerd" / "daemon"

    @property
    def containerd_root(self) -> Path:
        return self.data_root / "containerd" / "daemon"

    @property
    def containerd_config(self) -> Path:
        return self.workdir / "containerd.toml"

    @property
    def containerd_pidfile(self) -> Path:
        return self.workdir / "containerd.pid"

    @property
    def containerd_log(self) -> Path:
        return self.workdir / "containerd.log"

    @property
    def dockerd(self) -> Child:
        # dockerd writes its pidfile itself (daemon.json's "pidfile").
        return Child("dockerd", self.pidfile, self.log)

    @property
    def containerd(self) -> Child:
        return Child("containerd", self.containerd_pidfile, self.containerd_log)

    def too_long(self) -> list[str]:
        """The sockets of this layout that would not fit in a Unix socket address."""
        problems = []
        if len(os.fsencode(self.socket)) > SOCKET_PATH_MAX:
            problems.append(str(self.socket))
        if len(os.fsencode(self.exec_root)) + _EXEC_ROOT_SOCKET_TAIL > SOCKET_PATH_MAX:
            problems.append(f"{self.exec_root}/containerd/containerd.sock.ttrpc")
        return problems
