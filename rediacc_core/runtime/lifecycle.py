"""Bringing a repo up and down: its own dockerd (unless it uses an existing daemon) and its gate.

Where things live, for a repo with id ID on a machine rooted at ROOT:

- `ROOT/run/rediacc/<first 12 of ID>/gate.sock`: the gate, the only socket users get
  (`rdc repo docker-host` prints it); `gate.pid` beside it.
- `.../d/`: the daemon's working directory, mode 0700 (socket, pidfile, exec-root, daemon.json, log).
- `ROOT/var/lib/rediacc/repos/ID/docker`: the daemon's data-root; `.../gate.log`: the gate's log;
  `.../audit.log` (and `.1`...): its audit trail, one JSON line per decision.
- `ROOT/run/rediacc/metrics/ID.prom`: the gate's counters for node_exporter's textfile collector.

Unix socket paths are limited to 107 bytes. When the machine root is too deep for that, the run
directory moves to `/run/rediacc/<12 of ID>` (or `/tmp/rediacc-<12 of ID>` where /run is not
writable) and a `<ID>.rundir` file in `ROOT/run/rediacc` records where it went.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from rediacc_core import pids
from rediacc_core.errors import StateError, ToolError, ValidationError
from rediacc_core.machine import Machine
from rediacc_core.repos import AUDIT_LOG, Repo, RepoStore, repo_state_dir
from rediacc_core.runtime import daemon, kernelpath, netns, process
from rediacc_core.runtime.layout import SOCKET_PATH_MAX, DaemonPaths
from rediacc_core.runtime.process import Child, interrupts_deferred

# Bringing a repo up or down also needs the gate's pins, the files mount and the teardown sweep; they
# are imported there, so `rdc repo list` (which only reads paths and pidfiles) never loads the gate.

GATE_START_TIMEOUT = 30.0
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
    def network(self) -> netns.RepoNetwork:
        """The network namespace the repo's own daemon runs in (named by the first 12 of the id,
        which `data_dir` ends with)."""
        return netns.network_for(self.data_dir.name.replace("-", "")[:12], self.run_dir, self.data_dir)

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


def metrics_file(machine: Machine, repo: Repo) -> Path:
    """The repo gate's Prometheus textfile: one directory for every repo of the machine, so one
    node_exporter `--collector.textfile.directory` collects them all."""
    return machine.run_dir / "metrics" / f"{repo.id}.prom"


def _record_fallback(machine: Machine, repo: Repo, runtime: RepoRuntime) -> None:
    if runtime.run_dir.parent != machine.run_dir:
        machine.run_dir.mkdir(parents=True, exist_ok=True)
        (machine.run_dir / f"{repo.id}.rundir").write_text(f"{runtime.run_dir}\n")


def gate_argv(machine: Machine, repo: Repo, runtime: RepoRuntime) -> list[str]:
    """The command line of a background gate for `repo`."""
    return [
        sys.executable,
        "-m",
        "rediacc_core.runtime.serve",
        "--machine",
        machine.name,
        "--root",
        str(machine.root),
        "--repo-id",
        repo.id,
        "--listen",
        str(runtime.gate_socket),
        "--upstream",
        str(runtime.upstream_socket),
        "--pidfile",
        str(runtime.gate_pidfile),
    ]


def daemon_guard(repo: Repo, runtime: RepoRuntime) -> daemon.Guard:
    """The runtime guard of the repo's own daemon, however it is started (`rdc repo up`, its unit)."""
    return daemon.Guard(repo.id, repo.ref, runtime.guard_log)


def start_daemon(
    machine: Machine, repo: Repo, runtime: RepoRuntime, *, detach: bool
) -> daemon.RunningDaemon | None:
    """Start the repo's own dockerd unless it already answers; None when there was nothing to start.

    Its containers run under the runtime guard, so no container holding a device the repo lacks
    starts, whoever starts it (the gate, a restart policy, the daemon's own start after a crash)."""
    if not runtime.owns_daemon:
        return None
    paths = runtime.daemon_paths
    if daemon.ping(runtime.upstream_socket):
        if netns.exists(runtime.network):  # a port keeper (the uplink rules' watcher) that died comes back
            netns.bring_up(runtime.network, machine.root, paths.socket)
        return None
    runtime.data_dir.mkdir(parents=True, exist_ok=True)
    return daemon.start_dockerd(
        machine.root,
        paths.workdir,
        data_root=paths.data_root,
        detach=detach,
        guard=daemon_guard(repo, runtime),
        network=runtime.network,
        bring_up=lambda: netns.bring_up(runtime.network, machine.root, paths.socket),
    )


def repo_up(machine: Machine, repo: Repo, *, timeout: float = GATE_START_TIMEOUT) -> RepoRuntime:
    """Start what is not running (daemon, then gate); return once the gate's socket answers /_ping."""
    runtime = runtime_for(machine, repo)
    _record_fallback(machine, repo, runtime)
    if not runtime.owns_daemon and not daemon.ping(runtime.upstream_socket):
        raise StateError(
            f"repo {repo.ref} uses the Docker daemon at {repo.docker_host}, which does not answer",
            f"start that daemon first, then run rdc repo up {repo.ref} again",
        )
    from rediacc_core.runtime import filesmount

    if runtime.owns_daemon:
        _refuse_autoallowed_devices(machine, repo)
    was_down = not running_parts(machine, repo)
    interrupted: list[bool] = []
    try:
        with _noting_interrupts(interrupted):
            filesmount.secure_repo(machine, repo.id)  # before anything of the repo runs, and on every up
            runtime = _start(machine, repo, runtime, timeout)
    except BaseException as exc:
        # A Ctrl-C, or what it caused (a tool it killed failing): undo. Other errors leave what ran,
        # for their message and the log to explain, as they always did.
        if not interrupted and not isinstance(exc, KeyboardInterrupt):
            raise
        if was_down:
            _undo_interrupted_up(machine, repo)
        else:  # what ran before is not this command's to stop; what it started itself is
            with interrupts_deferred():
                process.stop_launched(5)
        if not isinstance(exc, KeyboardInterrupt):
            raise KeyboardInterrupt from exc
        raise
    finally:
        process.forget_launched()
    return runtime


@contextlib.contextmanager
def _noting_interrupts(noted: list[bool]) -> Iterator[None]:
    """A block in which a Ctrl-C still interrupts, and is noted: `noted` is non-empty once one came
    (the tools it also reached may fail first, and that failure is its doing)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) in (
        signal.SIG_IGN,
        None,
    ):
        yield  # no Ctrl-C reaches this process (a background job's SIGINT is ignored)
        return

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(True)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _undo_interrupted_up(machine: Machine, repo: Repo) -> None:
    """Ctrl-C during `repo up`: stop what it had started (those not recorded yet first, then by
    their pidfiles: uplink, containerd, dockerd, gate, mounts), so nothing of the repo runs while
    `repo list` says it is down; what cannot be stopped is said."""
    with interrupts_deferred():
        process.stop_launched(5)
        try:
            repo_down(machine, repo)
        except (StateError, OSError) as exc:
            what = exc.what if isinstance(exc, StateError) else str(exc)
            raise StateError(
                f"interrupted while starting repo {repo.ref}; what it had started is not all stopped: {what}",
                f"rdc repo down {repo.ref}",
            ) from exc


def _start(machine: Machine, repo: Repo, runtime: RepoRuntime, timeout: float) -> RepoRuntime:
    start_daemon(machine, repo, runtime, detach=True)
    if daemon.ping(runtime.gate_socket):
        return runtime  # already up
    runtime.run_dir.mkdir(parents=True, exist_ok=True)
    runtime.data_dir.mkdir(parents=True, exist_ok=True)
    gate = runtime.gate.start(gate_argv(machine, repo, runtime), record=False)  # outlives this command
    if not daemon.wait_for_ping(runtime.gate_socket, timeout, lambda: gate.poll() is None):
        if gate.poll() is None:
            pids.stop_pid(gate.pid, 5, gate)
        raise ToolError(
            f"the gate of repo {repo.ref} did not answer on {runtime.gate_socket} within {timeout:.0f}s; "
            "last log lines:\n" + runtime.gate.log_tail(),
            f"read {runtime.gate_log}",
        )
    return runtime


def _refuse_autoallowed_devices(machine: Machine, repo: Repo) -> None:
    """A repo daemon's BuildKit reads the machine's CDI specs itself: none may hand a device to
    every build step (`cdi.spec.BUILDKIT_AUTOALLOW`)."""
    from rediacc_core.cdi.spec import BUILDKIT_AUTOALLOW, autoallowed_specs

    found = autoallowed_specs(machine.cdi_dir)
    if found:
        raise StateError(
            "a CDI spec on this machine lets any build step have its device: " + "; ".join(found),
            f"remove the {BUILDKIT_AUTOALLOW} annotation (or the spec), then run: rdc repo up {repo.ref}",
        )


def _parts(runtime: RepoRuntime) -> list[Child]:
    """Every process of a repo that is up: its gate and, with a daemon of its own, that daemon,
    its containerd, its uplink and its port keeper."""
    children = [runtime.gate]
    if runtime.owns_daemon:
        paths, net = runtime.daemon_paths, runtime.network
        children += [paths.dockerd, paths.containerd, net.uplink, net.keeper]
    return children


def remove_kernel_path(machine: Machine, repo: Repo) -> list[str]:
    """The repo's veth and host chains, should an `rdc repo up` cut short have left them (found by
    name, as `repo down` finds them), at `rdc repo delete`: nothing of a deleted repo keeps its
    slot's addresses or rules. Returns what it removed."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        return []
    return kernelpath.tear_down(runtime_for(machine, repo).network.short)


def running_parts(machine: Machine, repo: Repo) -> list[str]:
    """What of the repo runs now ("gate (pid N)", "dockerd (pid N)", its containerd, uplink and port
    keeper); empty only when nothing of it runs (a `repo up` cut short leaves some of them)."""
    return repo_status(machine, repo)[1]


def repo_status(machine: Machine, repo: Repo) -> tuple[str, list[str]]:
    """`up` when every part of the repo runs, `down` when none does, else `partial`; and what runs."""
    children = _parts(runtime_for(machine, repo))
    running = []
    for child in children:
        pid = child.pid()
        if pid is not None:
            running.append(f"{child.what} (pid {pid})")
    if not running:
        return "down", running
    return ("up" if len(running) == len(children) else "partial"), running


def net_path(machine: Machine, repo: Repo) -> str | None:
    """The path out the repo's namespace took at its up (`kernel` or `user`, setting `net-path`);
    None while it has none (down, or on an existing daemon)."""
    runtime = runtime_for(machine, repo)
    found = netns.path_of(runtime.network) if runtime.owns_daemon and netns.exists(runtime.network) else None
    return found[0] if found is not None else None


def _release_pins(machine: Machine, repo: Repo) -> list[str]:
    """Unmount the repo's pinned bind sources (with its gate down, no new container can use them)
    and its files directory's nosuid,nodev mount."""
    from rediacc_core.gate.policy import pins
    from rediacc_core.runtime import filesmount

    released = pins.release_all(pins.directory_for(machine.run_dir, repo.id))
    filesmount.release_repo(machine, repo.id, repo.ref)
    return [f"released {len(released)} pinned bind source(s)"] if released else []


def repo_down(machine: Machine, repo: Repo, *, timeout: float = daemon.STOP_TIMEOUT) -> list[str]:
    """Stop the gate, the port keeper, then the repo's own daemon, then kill and unmount whatever of
    the repo is left (see `teardown`), then its namespace and uplink; returns what was stopped,
    killed and unmounted, for the user.

    Raises StateError naming what is still there when something of the repo survives all that.
    """
    runtime = runtime_for(machine, repo)
    stopped = []
    pid = runtime.gate.stop(timeout)
    if pid is not None:
        stopped.append(f"gate (pid {pid})")
    with contextlib.suppress(FileNotFoundError):
        runtime.gate_socket.unlink()
    if not runtime.owns_daemon:
        stopped += _release_pins(machine, repo)
        return stopped  # the daemon and its containers are not the repo's to stop
    from rediacc_core.runtime import teardown

    before = teardown.footprint(runtime.daemon_paths)
    # The port keeper before dockerd: dockerd waits 5 s on shutdown for the keeper's open event
    # stream to close. The forwards it made go with the uplink, last.
    pid = runtime.network.keeper.stop(netns.PROCESS_STOP_TIMEOUT)
    if pid is not None:
        stopped.append(f"port keeper (pid {pid})")
    pid = runtime.daemon_paths.dockerd.stop(timeout)
    if pid is not None:
        stopped.append(f"dockerd (pid {pid})")
    pid = runtime.daemon_paths.containerd.stop(timeout)  # after dockerd: it stopped the containers
    if pid is not None:
        stopped.append(f"containerd (pid {pid})")
    swept = teardown.sweep(before)
    stopped += [f"killed {what}" for what in swept.killed]
    stopped += [f"unmounted {point}" for point in swept.unmounted]
    stopped += _release_pins(machine, repo)
    if not swept.left:  # the namespace goes last: what is left of the repo may still be in it
        stopped += [f"removed {what}" for what in netns.tear_down(runtime.network, repo.ref)]
    if swept.left:
        raise StateError(
            f"repo {repo.ref} still has, after stopping its daemon: " + "; ".join(swept.left),
            f"stop those processes (as root), unmount those paths, then run rdc repo down {repo.ref} again",
        )
    return stopped


def running_repos(machine: Machine) -> list[tuple[Repo, list[str]]]:
    """Every repo of the machine with something running, and what (by `running_parts`, the reading
    `rdc repo list` shows): what a command must look at before it deletes, re-points or forgets."""
    found = []
    for repo in RepoStore(machine).list():
        parts = running_parts(machine, repo)
        if parts:
            found.append((repo, parts))
    return found


def orphaned_parts(machine: Machine) -> list[tuple[Path, list[str]]]:
    """What runs of repos the machine no longer records (deleted by hand or by an older rdc while
    up): each run directory with the parts still running there, found by the same pidfiles."""
    known = {repo.id.replace("-", "")[:12] for repo in RepoStore(machine).list()}
    places: dict[str, Path] = {}
    if machine.run_dir.is_dir():
        for entry in machine.run_dir.iterdir():
            is_short_id = len(entry.name) == 12 and all(c in "0123456789abcdef" for c in entry.name)
            if entry.is_dir() and is_short_id and entry.name not in known:
                places[entry.name] = entry
            elif entry.suffix == ".rundir" and entry.stem.replace("-", "")[:12] not in known:
                with contextlib.suppress(OSError):  # a run directory moved for its socket paths
                    places[entry.stem.replace("-", "")[:12]] = Path(entry.read_text().strip())
    found = []
    for short, run_dir in sorted(places.items()):
        # Its daemon's own parts too: which it had is not recorded any more, so every kind is read.
        runtime = RepoRuntime(run_dir, machine.root / "var/lib/rediacc/repos" / short, None)
        children = [runtime.gate, runtime.daemon_paths.dockerd, runtime.daemon_paths.containerd]
        children += [runtime.network.uplink, runtime.network.keeper]
        running = [f"{c.what} (pid {pid})" for c in children if (pid := c.pid()) is not None]
        if running:
            found.append((run_dir, running))
    return found


def refuse_while_running(machine: Machine, doing: str, *, instead: str = "") -> None:
    """Raise StateError naming each running repo of the machine and the `rdc repo down` that frees
    it, so that `doing` never orphans what runs (a daemon whose repo record or machine is gone)."""
    running = running_repos(machine)
    orphans = orphaned_parts(machine)
    if not running and not orphans:
        return
    what = "; ".join(f"{repo.ref}: {', '.join(parts)}" for repo, parts in running)
    todo = "; ".join(f"rdc repo down {repo.ref}" for repo, _ in running)
    if orphans:  # no repo record names them, so no `rdc repo down` can: their pids are the way
        what = "; ".join([*([what] if what else []), *(orphan_text(d, parts) for d, parts in orphans)])
        pids = " ".join(part.rsplit("pid ", 1)[1].rstrip(")") for _, parts in orphans for part in parts)
        todo = "; ".join([*([todo] if todo else []), f"kill {pids}"])
    raise StateError(
        f"not {doing}: repos of machine {machine.name} are running ({what})",
        f"stop them first: {todo}" + (f"; or {instead}" if instead and not orphans else ""),
    )


def orphan_text(run_dir: Path, parts: list[str]) -> str:
    return f"a deleted repo's {', '.join(parts)} (under {run_dir})"
