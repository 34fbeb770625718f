"""Where a repo's running parts keep everything, computed (nothing here creates, starts or stops
anything): its run and data directories (`RepoRuntime`, `runtime_for`), its private daemon's working
directory (socket, pidfile, exec-root, config, log) and data root, with its own containerd laid out
as dockerd would lay out the one it supervises (`DaemonPaths`), and its network namespace's files
(`RepoNetwork`, `path_of`). Kept short: Unix socket paths are limited to 107 bytes.

`rdc repo list` reads which parts run through these paths alone (`runtime.status`), so this module
imports none of the modules that make them (`daemon`, `netns`, `lifecycle`).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rediacc_core.errors import ValidationError
from rediacc_core.machine import Machine
from rediacc_core.repos import AUDIT_LOG, Repo, repo_state_dir
from rediacc_core.runtime.process import Child

if TYPE_CHECKING:
    from rediacc_core.runtime.kernelpath import Slot

NETNS_DIR = Path("/run/netns")
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


@dataclass(frozen=True)
class RepoNetwork:
    """One repo's namespace and the files of its uplink (under the repo's run directory)."""

    name: str
    workdir: Path
    state_dir: Path | None = None  # the repo's state directory: where its kernel path's slot is kept

    @property
    def short(self) -> str:
        return self.name.removeprefix("rdc-")

    @property
    def path_record(self) -> Path:
        """Which path out this namespace was brought up with (`kernel N`, N its slot, or `user`):
        kept while the namespace lives, so a setting changed meanwhile applies at the next up."""
        return self.workdir / "path"

    @property
    def path(self) -> Path:
        return NETNS_DIR / self.name

    @property
    def pidfile(self) -> Path:
        return self.workdir / "uplink.pid"

    @property
    def log(self) -> Path:
        return self.workdir / "uplink.log"

    @property
    def api_socket(self) -> Path:
        """slirp4netns's API: the port keeper (`ports`) adds and removes forwards through it."""
        return self.workdir / "uplink.sock"

    @property
    def ports_pidfile(self) -> Path:
        return self.workdir / "ports.pid"

    @property
    def ports_log(self) -> Path:
        return self.workdir / "ports.log"

    # Both are told apart from a process that reused their pid by their command line.
    @property
    def uplink(self) -> Child:
        return Child("network uplink", self.pidfile, self.log, mark=str(self.path))

    @property
    def keeper(self) -> Child:
        return Child("port keeper", self.ports_pidfile, self.ports_log, mark=str(self.api_socket))


def network_for(short_id: str, run_dir: Path, state_dir: Path | None = None) -> RepoNetwork:
    return RepoNetwork(f"rdc-{short_id}", run_dir / "net", state_dir)


def path_of(net: RepoNetwork) -> tuple[str, Slot | None] | None:
    """The path out `net` was brought up with, and its slot on the kernel path; None when not up."""
    try:
        words = net.path_record.read_text().split()
    except OSError:
        return None
    # Late: only a namespace that is up has a record; `rdc repo list` of repos that are down never
    # reads one, so it loads none of the kernel path's tools (subprocess, shutil).
    from rediacc_core.runtime import kernelpath

    if words == [kernelpath.USER]:
        return kernelpath.USER, None
    if len(words) == 2 and words[0] == kernelpath.KERNEL and words[1].isdigit():
        with contextlib.suppress(ValueError):
            return kernelpath.KERNEL, kernelpath.slot(int(words[1]))
    return None


_GATE_SOCKET_NAME = "gate.sock"


@dataclass(frozen=True)
class RepoRuntime:
    """Every path of one repo's running parts."""

    run_dir: Path
    data_dir: Path
    docker_host: str | None  # the repo's own daemon URL when it has one (unix:///...), else None

    @property
    def gate_socket(self) -> Path:
        return self.run_dir / _GATE_SOCKET_NAME

    @property
    def gate_pidfile(self) -> Path:
        return self.run_dir / "gate.pid"

    @property
    def gate_log(self) -> Path:
        return self.data_dir / "gate.log"

    @property
    def gate(self) -> Child:
        # The gate writes its pidfile itself, and removes it when it stops (`runtime.serve`).
        return Child("gate", self.gate_pidfile, self.gate_log)

    @property
    def audit_log(self) -> Path:
        return self.data_dir / AUDIT_LOG

    @property
    def guard_log(self) -> Path:
        """The runtime guard's refusals (`runtime.guard`), one JSON line each."""
        return self.data_dir / "guard.log"

    @property
    def daemon_paths(self) -> DaemonPaths:
        return DaemonPaths(self.run_dir / "d", self.data_dir / "docker")

    @property
    def network(self) -> RepoNetwork:
        """The network namespace the repo's own daemon runs in (named by the first 12 of the id,
        which `data_dir` ends with)."""
        return network_for(self.data_dir.name.replace("-", "")[:12], self.run_dir, self.data_dir)

    @property
    def upstream_socket(self) -> Path:
        """What the gate forwards to: the existing daemon's socket, or the repo's own."""
        if self.docker_host is not None:
            return Path(self.docker_host.removeprefix("unix://"))
        return self.daemon_paths.socket

    @property
    def owns_daemon(self) -> bool:
        return self.docker_host is None

    @property
    def docker_host_url(self) -> str:
        return f"unix://{self.gate_socket}"


def _fits(run_dir: Path) -> bool:
    paths = DaemonPaths(run_dir / "d", run_dir / "data")
    gate = len(os.fsencode(run_dir / _GATE_SOCKET_NAME)) <= SOCKET_PATH_MAX
    return gate and not paths.too_long()


def _fallback_dir(short: str) -> Path:
    run = Path("/run")
    if os.access(run, os.W_OK):
        return run / "rediacc" / short
    return Path("/tmp") / f"rediacc-{short}"


def runtime_for(machine: Machine, repo: Repo) -> RepoRuntime:
    """The paths for `repo` (computed, the same every time; nothing is created)."""
    short = repo.id.replace("-", "")[:12]
    run_dir = machine.run_dir / short
    if not _fits(run_dir):
        run_dir = _fallback_dir(short)
        if not _fits(run_dir):
            raise ValidationError(
                f"no short enough directory for the sockets of repo {repo.ref}",
                "use a machine root with a shorter path",
            )
    data_dir = repo_state_dir(machine, repo.id)
    return RepoRuntime(run_dir, data_dir, repo.docker_host)
