"""Bringing a repo up and down: its own dockerd (unless it uses an existing daemon) and its gate.

Where things live, for a repo with id ID on a machine rooted at ROOT (`layout.runtime_for` computes
it; `status` reads which parts run, without this module):

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
from pathlib import Path
from types import FrameType

from rediacc_core import pids
from rediacc_core.errors import StateError, ToolError
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import daemon, kernelpath, netns, process
from rediacc_core.runtime.layout import RepoRuntime, runtime_for
from rediacc_core.runtime.process import interrupts_deferred
from rediacc_core.runtime.status import orphan_text, orphaned_parts, running_parts

# Bringing a repo up or down also needs the gate's pins, the files mount and the teardown sweep; they
# are imported there, so `rdc repo list` (which only reads paths and pidfiles) never loads the gate.

GATE_START_TIMEOUT = 30.0


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


def remove_kernel_path(machine: Machine, repo: Repo) -> list[str]:
    """The repo's veth and host chains, should an `rdc repo up` cut short have left them (found by
    name, as `repo down` finds them), at `rdc repo delete`: nothing of a deleted repo keeps its
    slot's addresses or rules. Returns what it removed."""
    if os.geteuid() != 0 or shutil.which("iptables") is None:
        return []
    return kernelpath.tear_down(runtime_for(machine, repo).network.short)


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
