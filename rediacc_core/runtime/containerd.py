"""A repo daemon's own containerd, started by rdc before its dockerd and named to it.

dockerd uses the host's containerd whenever `/run/containerd/containerd.sock` exists (every host
with Docker CE, or Debian's docker.io under systemd, has one), and only otherwise starts one of its
own. On such a host every repo's containers, shims and (with the containerd image store) images
would live in that one containerd, in one namespace, under the host's `/var/lib/containerd`, where
neither `rdc repo down`, `fork` nor `delete` can see them. So each repo daemon gets a containerd of
its own, whatever the host runs, laid out exactly as dockerd lays out the one it would supervise
(state under its exec-root, data under its data-root): teardown, fork and the socket-length check
find it where they always did.

    start_containerd(paths, network) -> pid   # returns once its socket accepts connections
    launch_containerd(paths, network) -> process | None   # returns at once (start_containerd waits)
    stop_containerd(paths) -> pid | None
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

from rediacc_core import pids
from rediacc_core.errors import ToolError
from rediacc_core.files import atomic_write_text
from rediacc_core.runtime.layout import DaemonPaths, RepoNetwork
from rediacc_core.runtime.netns import enter
from rediacc_core.unixhttp import listening

START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0  # seconds it has to stop after its dockerd did
POLL = 0.01  # seconds between looks at its socket: a repo's start waits on it (it listens in ~50 ms)

# The CRI plugin is Kubernetes' (it would look for CNI and serve a second API); none of it is used.
_DISABLED = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime")


def _quoted(value: object) -> str:
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def config_toml(paths: DaemonPaths) -> str:
    """The containerd config of one repo daemon: version 2 (containerd 1.6 and 1.7 read it; 2.x
    migrates it), everything under the repo's own directories, its socket 0600 root."""
    disabled = ", ".join(_quoted(p) for p in _DISABLED)
    return (
        "# rdc: this repo daemon's own containerd (rediacc_core/runtime/containerd.py)\n"
        "version = 2\n"
        f"root = {_quoted(paths.containerd_root)}\n"
        f"state = {_quoted(paths.containerd_state)}\n"
        f"disabled_plugins = [{disabled}]\n"
        "oom_score = -500\n"
        "\n[grpc]\n"
        f"  address = {_quoted(paths.containerd_socket)}\n"
        "  uid = 0\n  gid = 0\n"
        "\n[ttrpc]\n"
        f"  address = {_quoted(str(paths.containerd_socket) + '.ttrpc')}\n"
        "\n[debug]\n"
        f"  address = {_quoted(paths.containerd_state.parent / 'containerd-debug.sock')}\n"
        '  level = "info"\n'
    )


def containerd_argv(
    paths: DaemonPaths, containerd: str = "containerd", network: RepoNetwork | None = None
) -> list[str]:
    argv = [containerd, "--config", str(paths.containerd_config)]
    return enter(network, argv) if network is not None else argv


def running_pid(paths: DaemonPaths) -> int | None:
    """The repo's containerd when it runs and answers (a dockerd restarted alone reuses it)."""
    pid = paths.containerd.pid()
    return pid if pid is not None and listening(paths.containerd_socket) else None


def launch_containerd(
    paths: DaemonPaths,
    network: RepoNetwork | None = None,
    *,
    containerd: str = "containerd",
    detach: bool = False,
) -> subprocess.Popen[bytes] | None:
    """Start the repo daemon's containerd unless it already runs and answers, without waiting for
    it: the process, for `start_containerd(launched=…)` to wait on (None when one answers)."""
    if running_pid(paths) is not None:
        return None
    return _launch(paths, network, containerd, detach)


def _launch(
    paths: DaemonPaths, network: RepoNetwork | None, containerd: str, detach: bool
) -> subprocess.Popen[bytes]:
    for directory in (paths.containerd_root, paths.containerd_state):
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    atomic_write_text(paths.containerd_config, config_toml(paths), mode=0o600)
    for stale in (paths.containerd_socket, Path(str(paths.containerd_socket) + ".ttrpc")):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    try:
        # nsenter execs containerd in its own place: the pid recorded is containerd's.
        return paths.containerd.start(containerd_argv(paths, containerd, network), detach=detach)
    except OSError as exc:
        raise ToolError(
            f"cannot run {containerd}: {exc.strerror}", "install containerd (Docker Engine needs it)"
        ) from exc


def start_containerd(
    paths: DaemonPaths,
    network: RepoNetwork | None = None,
    *,
    containerd: str = "containerd",
    detach: bool = False,
    timeout: float = START_TIMEOUT,
    launched: subprocess.Popen[bytes] | None = None,
) -> int:
    """Start the repo daemon's containerd unless it already runs; its pid, once its socket answers.
    `launched`: the one `launch_containerd` started, waited for rather than started again."""
    if launched is None:
        running = running_pid(paths)
        if running is not None:
            return running
        launched = _launch(paths, network, containerd, detach)
    deadline = time.monotonic() + timeout
    while not listening(paths.containerd_socket):
        if launched.poll() is not None or time.monotonic() > deadline:
            pids.stop_pid(launched.pid, 5, launched)
            raise ToolError(
                f"the repo daemon's containerd did not answer on {paths.containerd_socket}; last log "
                "lines:\n" + paths.containerd.log_tail(),
                f"read {paths.containerd_log}",
            )
        time.sleep(POLL)
    return launched.pid


def stop_containerd(paths: DaemonPaths, timeout: float = STOP_TIMEOUT) -> int | None:
    """Stop the repo daemon's containerd (after its dockerd); its pid, or None when none ran."""
    return paths.containerd.stop(timeout)
