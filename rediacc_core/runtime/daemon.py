"""A private Docker daemon: its configuration, start, readiness and stop.

Each repo runs its own `dockerd` that reads CDI specs only from the machine's `<root>/etc/cdi`,
keeps its data, state and socket to itself, and runs in the repo's own network namespace
(`netns`), where it manages its bridges and iptables as usual. A daemon started without one (tests,
benchmarks) has no default bridge and leaves the host's iptables and forwarding alone, so several
run side by side.
Its socket sits in a 0700 directory: only the gate (root) may talk to it; users reach the daemon
through the gate's socket.

Public for tests and the benchmark:

    start_dockerd(root, workdir) -> RunningDaemon   # returns once the daemon answers /_ping
    RunningDaemon.socket / .pid / .log / .stop()

Layout under `workdir` (kept short: Unix socket paths are limited to 107 bytes):
`daemon.json`, `docker.sock`, `dockerd.pid`, `exec/` (exec-root), `dockerd.log`, and `data/` unless
`data_root` is given, and `runtime-guard` when the daemon runs its containers under the runtime
guard (`runtime.guard`: a repo's own daemon always does).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rediacc_core.errors import StateError, ToolError, ValidationError
from rediacc_core.files import atomic_write_json, atomic_write_text
from rediacc_core.machine import Machine
from rediacc_core.pids import pid_alive, stop_pid
from rediacc_core.runtime import netns
from rediacc_core.runtime.layout import DaemonPaths, RepoNetwork
from rediacc_core.runtime.netns import UPLINK_DNS, UPLINK_MTU, enter
from rediacc_core.runtime.process import log_tail

START_TIMEOUT = 60.0
STOP_TIMEOUT = 30.0  # seconds dockerd has to stop its containers before SIGKILL


@dataclass(frozen=True)
class Guard:
    """Whose grants the runtime guard checks a daemon's containers against, and where it logs."""

    repo_id: str
    repo_ref: str
    log: Path
    runc: str = ""  # the runc the guard runs; "" = the one on PATH


def guard_script(root: Path, guard: Guard) -> str:
    """The daemon's default runtime: a shell wrapper that calls the Python guard only for the runc
    subcommands after which the container's processes run (the rest go straight to runc)."""
    from rediacc_core.runtime import guard as runtime_guard

    runc = guard.runc or shutil.which("runc") or "/usr/bin/runc"
    import yaml  # where PyYAML lives, for the guard's interpreter started without site-packages

    argv = [
        sys.executable,
        "-S",
        "-I",
        runtime_guard.__file__,
        "--runc",
        runc,
        "--grants",
        str(root / "etc/rediacc/gpu/grants.json"),
        "--inventory",
        str(root / "etc/rediacc/gpu/inventory.json"),
        "--cdi-dir",
        str(root / "etc" / "cdi"),
        "--health",
        str(root / "etc/rediacc/gpu/health.json"),
        "--settings",
        str(root / "etc/rediacc/settings.json"),
        "--repo-id",
        guard.repo_id,
        "--repo-ref",
        guard.repo_ref,
        "--guard-log",
        str(guard.log),
        "--yaml-path",
        str(Path(yaml.__file__).parent.parent),
        "--",
    ]
    gated = "|".join(f'*" {name} "*' for name in sorted(runtime_guard.GATED))
    return (
        "#!/bin/sh\n"
        f"# rdc's runtime guard for repo {guard.repo_ref}: see rediacc_core/runtime/guard.py\n"
        f'case " $* " in\n  {gated}) exec {shlex.join(argv)} "$@" ;;\nesac\n'
        f'exec {shlex.quote(runc)} "$@"\n'
    )


def daemon_config(
    root: Path,
    paths: DaemonPaths,
    guard: Guard | None = None,
    network: RepoNetwork | None = None,
    image_store: str = "overlay2",
) -> dict[str, Any]:
    """daemon.json for a repo daemon on the machine rooted at `root`; with `guard`, its containers
    run under the runtime guard (a container created with another runtime is refused by the gate);
    with `network`, the daemon runs in that namespace of its own (`netns`); `image_store` is the
    machine's setting of that name."""
    runtimes: dict[str, Any] = {}
    if guard is not None:
        from rediacc_core.gate.policy.rules import GUARD_RUNTIME  # only a daemon with a guard names it

        runtimes = {
            "runtimes": {GUARD_RUNTIME: {"path": str(paths.guard_script)}},
            "default-runtime": GUARD_RUNTIME,
        }
    return {
        **runtimes,
        # The containerd image store lives in the repo's own containerd (below), so it is the repo's.
        "features": {
            "cdi": True,
            **({"containerd-snapshotter": True} if image_store == "containerd" else {}),
        },
        "cdi-spec-dirs": [str(root / "etc" / "cdi")],
        **(_namespaced() if network is not None else _host_namespace()),
        "data-root": str(paths.data_root),
        "exec-root": str(paths.exec_root),
        # Its own containerd, never the host's (`runtime.containerd`): no two repos share one.
        "containerd": str(paths.containerd_socket),
        "pidfile": str(paths.pidfile),
        "hosts": [f"unix://{paths.socket}"],
        # No TCP, no extra groups: the socket directory is 0700 and only the gate connects.
        "group": "root",
        # Defence in depth: defaults that narrow what a request can ask, should one get past the
        # gate's rules. Each is a key Docker Engine 25 and 26.1 accept (a test validates the file
        # with the installed dockerd, and the e2e suite runs containers under it).
        # setuid binaries in a container cannot gain privileges (`--security-opt
        # no-new-privileges=false` is refused by the gate, so this holds for every container).
        "no-new-privileges": True,
        # A container sees only its own cgroup subtree, never the host's or another repo's.
        "default-cgroupns-mode": "private",
        # No container joins another's IPC namespace unless asked by name (shareable is the default).
        "default-ipc-mode": "private",
        # BuildKit refuses `--allow network.host` and `--allow security.insecure` (a build step with
        # the host's network or a privileged one). Docker 26's BuildKit has no device entitlement.
        "builder": {"entitlements": {"network-host": False, "security-insecure": False}},
        # A published port must not make a root docker-proxy listen on the host's addresses.
        "userland-proxy": False,
        # Containers stop with their daemon: `rdc repo down` relies on it to leave nothing running.
        "live-restore": False,
        # A tenant's container logs cannot fill the host's disk (a per-container --log-opt can
        # still choose other sizes; the daemon's default bounds every container that does not).
        "log-opts": {"max-size": "20m", "max-file": "3"},
        # Not set: "icc" (it applies only to the default bridge, which a repo daemon does not have)
        # and "userns-remap" (it would break binds of the repo's files and granted device nodes).
    }


def _namespaced() -> dict[str, Any]:
    # In the repo's own namespace, iptables, forwarding and the default bridge are the namespace's,
    # not the host's: dockerd masquerades its networks out through the uplink, whose forwarder
    # resolves names, and publishes ports on the namespace's address (`ports` forwards them).
    # Every bridge takes the uplink's MTU: the uplink ends each connection in its own sockets, so
    # no link beyond it limits a packet's size, and a 1500-byte MTU cuts a download through it to
    # about half the host's rate at twice the CPU (bench/netns_cost.py). A network created with
    # its own `com.docker.network.driver.mtu` keeps that.
    mtu = {"com.docker.network.driver.mtu": str(UPLINK_MTU)}
    # No ip6tables: the namespace has no IPv6 route out (the uplink carries none, the veth's IPv6 is
    # off at both ends), so IPv6 rules would guard nothing that leaves it; Engine 28 sets up every
    # chain again for IPv6 at each start (its default is true; 26.1's is false), about 55 ms
    # of its start (bench/results/netns-cost.md). Both engines accept the key.
    return {
        "iptables": True,
        "ip6tables": False,
        "ip-forward": True,
        "dns": [UPLINK_DNS],
        "mtu": UPLINK_MTU,
        "default-network-opts": {"bridge": mtu},
    }


def _host_namespace() -> dict[str, Any]:
    # A daemon in the host's namespace (tests, benchmarks) leaves the host's netfilter and its
    # IP forwarding (a host-wide sysctl) as they are and makes no default bridge, so several run
    # side by side. ip6tables too: Engine 28 (its default is true, whatever "iptables" says) would
    # otherwise add its chains and FORWARD jumps to the host's ip6tables at each start.
    return {"bridge": "none", "iptables": False, "ip6tables": False, "ip-forward": False}


# A dockerd in a repo's namespace must not find the system bus: where firewalld runs, dockerd hands
# every iptables rule to it over D-Bus, and firewalld writes it into the host's tables, not the
# namespace's (the repo's NAT and isolation would land on the host). With no bus, dockerd sees no
# firewalld and runs iptables itself, in the namespace. (Only dockerd: runc, under containerd,
# may need the bus for systemd's cgroups.)
NO_SYSTEM_BUS = "DBUS_SYSTEM_BUS_ADDRESS=unix:path=/nonexistent"


def dockerd_argv(
    paths: DaemonPaths, dockerd: str = "dockerd", network: RepoNetwork | None = None
) -> list[str]:
    argv = [dockerd, "--config-file", str(paths.config)]
    return enter(network, ["env", NO_SYSTEM_BUS, *argv]) if network is not None else argv


_MNT_DETACH = 2


def unmount(point: str | os.PathLike[str]) -> str | None:
    """Detach one mount from `point`; None when done, else why not."""
    import ctypes  # late: only an unmount needs libc; `rdc repo list` reads a repo's state through here

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(os.fsencode(point), _MNT_DETACH) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def undo_crashed_bind(paths: DaemonPaths) -> bool:
    """Unmount the data-root bind a dockerd killed before its shutdown left behind; True if it did.

    dockerd binds its data-root onto itself and leaves `unmount-on-shutdown` in its exec-root to say
    so, removing both when it stops. After a SIGKILL both stay, the next dockerd stacks a bind of its
    own, and every crash would leak one mount that outlives `rdc repo down`."""
    marker = paths.exec_root / "unmount-on-shutdown"
    if not marker.exists():
        return False
    undone = unmount(paths.data_root) is None
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    return undone


def prepare(
    root: Path, paths: DaemonPaths, guard: Guard | None = None, network: RepoNetwork | None = None
) -> None:
    """Create the directories and write daemon.json and the guard's wrapper (atomically)."""
    problems = paths.too_long()
    if problems:
        raise ValidationError(
            "socket path too long for a Unix socket (max 107 bytes): " + ", ".join(problems),
            "use a shorter working directory for the daemon",
        )
    paths.workdir.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.workdir, 0o700)  # the daemon's socket is reachable by root only: users go through the gate
    paths.data_root.mkdir(parents=True, exist_ok=True)
    if guard is not None:
        atomic_write_text(paths.guard_script, guard_script(root, guard), mode=0o700)
    atomic_write_json(paths.config, daemon_config(root, paths, guard, network, _image_store(root)))


def _image_store(root: Path) -> str:
    from rediacc_core.settings import effective, read_settings

    return effective(read_settings(Machine(name="local", root=root)))["image-store"]


def ping(sock: Path, timeout: float = 2.0) -> bool:
    """True when something at `sock` answers `GET /_ping` with 200."""
    import http.client  # here: a command that only reads paths and pidfiles needs no HTTP client

    from rediacc_core import unixhttp

    try:
        status, _ = unixhttp.request(sock, "GET", "/_ping", headers={"Connection": "close"}, timeout=timeout)
    except (OSError, http.client.HTTPException):
        return False
    return status == 200


# How often a starting daemon is asked whether it answers. Short and fixed: a growing delay (it
# was 0.05 s times 1.5 up to 0.5 s) found a daemon ready at 410 ms only at 660 ms. A ping before the
# socket exists costs one failed connect(); once dockerd listens (at its start, before it serves),
# the ping waits in the socket's backlog until the daemon answers it.
PING_POLL = 0.01


def wait_for_ping(sock: Path, timeout: float, alive: Any = None) -> bool:
    """Poll `sock` until it answers; gives up early when `alive()` turns False."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(sock, timeout=max(0.1, min(2.0, deadline - time.monotonic()))):
            return True
        if alive is not None and not alive():
            return False
        time.sleep(PING_POLL)
    return False


@dataclass
class RunningDaemon:
    """A started dockerd. `stop()` terminates it (and so its containers and containerd)."""

    socket: Path
    pid: int
    log: Path
    paths: DaemonPaths
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop dockerd (and so its containers), then its containerd."""
        if self.alive():
            stop_pid(self.pid, timeout, self.process)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self.paths.containerd.stop(timeout)  # after dockerd: it stopped the containers


def start_dockerd(
    root: Path,
    workdir: Path,
    *,
    data_root: Path | None = None,
    dockerd: str = "dockerd",
    timeout: float = START_TIMEOUT,
    detach: bool = False,
    extra_args: Sequence[str] = (),
    guard: Guard | None = None,
    network: RepoNetwork | None = None,
    bring_up: Callable[[], None] | None = None,
) -> RunningDaemon:
    """Start a private dockerd for the machine rooted at `root`; return once it answers /_ping.

    `workdir` holds its socket, pidfile, exec-root and log (and data, unless `data_root` is given).
    `detach=True` puts it in its own session so it outlives the caller (`rdc repo up`). With
    `network`, the daemon and its containerd run in that namespace, made here when missing, and
    `bring_up` (`netns.bring_up` of it) is run while its containerd starts. Raises StateError when a
    daemon from this workdir is still running, ToolError when it does not start.
    """
    paths = DaemonPaths(workdir, data_root if data_root is not None else workdir / "data")
    running = paths.dockerd.pid()
    if running is not None:
        raise StateError(
            f"a dockerd (pid {running}) is already running from {workdir}",
            "stop it first, or use its socket " + str(paths.socket),
        )
    undo_crashed_bind(paths)  # no daemon of this workdir runs (checked above)
    prepare(root, paths, guard, network)
    with contextlib.suppress(FileNotFoundError):
        paths.socket.unlink()
    # Imported here: a command that only reads pidfiles needs no socket client.
    from rediacc_core.runtime.containerd import launch_containerd, start_containerd

    if network is not None:
        netns.create(network)
    # containerd starts (about 40 ms until it answers) while `bring_up` gives the namespace its
    # refusal rules and then its way out. Nothing can leave meanwhile: until `bring_up`'s uplink
    # or veth exists the namespace has its loopback alone, and `bring_up` makes neither before
    # the rules (its order is unchanged); containerd fetches nothing and starts no container by
    # itself (its CRI plugin is off; containers are dockerd's, restart policies too, and dockerd
    # starts only once `bring_up` has returned).
    launched = launch_containerd(paths, network, detach=detach)
    if bring_up is not None:
        try:
            bring_up()
        except BaseException:
            if launched is not None:
                paths.containerd.stop(5)  # as though `bring_up` had come first
            raise
    start_containerd(paths, network, detach=detach, launched=launched)
    try:
        # dockerd writes its own pidfile (daemon.json), once it is ready to.
        process = paths.dockerd.start(
            [*dockerd_argv(paths, dockerd, network), *extra_args], detach=detach, record=False
        )
    except OSError as exc:
        paths.containerd.stop(5)
        raise ToolError(f"cannot run {dockerd}: {exc.strerror}", "install Docker Engine >= 25") from exc
    daemon = RunningDaemon(paths.socket, process.pid, paths.log, paths, process)
    if not wait_for_ping(paths.socket, timeout, daemon.alive):
        daemon.stop(5)
        raise ToolError(
            f"dockerd did not answer on {paths.socket} within {timeout:.0f}s; last log lines:\n"
            + log_tail(paths.log),
            f"read {paths.log}",
        )
    return daemon


def attach_dockerd(workdir: Path, data_root: Path | None = None) -> RunningDaemon | None:
    """The daemon a pidfile in `workdir` names, when it is still running (for `rdc repo down`)."""
    paths = DaemonPaths(workdir, data_root if data_root is not None else workdir / "data")
    pid = paths.dockerd.pid()
    if pid is None:
        return None
    return RunningDaemon(paths.socket, pid, paths.log, paths)


def dump_config(
    root: Path, paths: DaemonPaths, guard: Guard | None = None, network: RepoNetwork | None = None
) -> str:
    return json.dumps(daemon_config(root, paths, guard, network), indent=2)
