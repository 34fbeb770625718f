"""Which of a repo's parts run now, read from their pidfiles: what `rdc repo list` shows (`repo_status`,
`net_path`) and what a command looks at before it changes a repo or a machine (`running_parts`,
`orphaned_parts`). It reads the paths of `layout` alone: reading a status loads none of the modules
that start or stop the parts (`daemon`, `netns`, `lifecycle`; `tests/test_cli_imports.py`)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.layout import RepoRuntime, path_of, runtime_for
from rediacc_core.runtime.process import Child


def _parts(runtime: RepoRuntime) -> list[Child]:
    """Every process of a repo that is up: its gate and, with a daemon of its own, that daemon,
    its containerd, its uplink and its port keeper."""
    children = [runtime.gate]
    if runtime.owns_daemon:
        paths, net = runtime.daemon_paths, runtime.network
        children += [paths.dockerd, paths.containerd, net.uplink, net.keeper]
    return children


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
    found = path_of(runtime.network) if runtime.owns_daemon and runtime.network.path.exists() else None
    return found[0] if found is not None else None


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


def orphan_text(run_dir: Path, parts: list[str]) -> str:
    return f"a deleted repo's {', '.join(parts)} (under {run_dir})"
