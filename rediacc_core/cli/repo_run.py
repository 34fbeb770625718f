"""`rdc repo up | down | docker-host | gate [log] | dockerd | units`: running a repo's daemon and gate."""

from __future__ import annotations

import json
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import emit, fitted, note, output_option, table, waiting
from rediacc_core.config import Config, serving_client
from rediacc_core.errors import EXIT_INTERRUPTED, PermissionDeniedError, StateError, ValidationError
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, resolve_ref
from rediacc_core.runtime import daemon, filesmount, lifecycle, netns
from rediacc_core.runtime.layout import runtime_for
from rediacc_core.runtime.status import repo_status

UNIT_TEMPLATES = ("rediacc-repo-dockerd@.service", "rediacc-repo-gate@.service")


def _resolve(ref: str) -> tuple[Machine, Repo]:
    return resolve_ref(ref, Config.load())


@click.command("up")
@click.argument("ref", metavar="REPO-REF")
@click.option(
    "--foreground", is_flag=True, help="Run the daemon and the gate in this process until stopped (systemd)."
)
@output_option("table", "json", "yaml")
def up(ref: str, foreground: bool, fmt: str) -> None:
    """\b
    Examples:
      sudo rdc repo up gpu-a
      sudo rdc repo up gpu-a -o json
    """
    machine, found = _resolve(ref)
    if found.docker_host is None and os.geteuid() != 0:
        # dockerd refuses to start without root; saying so here beats a daemon log to read.
        raise PermissionDeniedError(
            f"starting the Docker daemon of repo {found.ref} needs root",
            f"rerun it as root: sudo rdc repo up {found.ref}",
        )
    if foreground:
        _up_foreground(machine, found)
        return
    try:
        runtime = lifecycle.repo_up(machine, found)
    except KeyboardInterrupt:
        _say_where_it_stands(machine, found, "starting")
        raise
    emit({"repo": found.ref, "repoId": found.id, "dockerHost": runtime.docker_host_url}, fmt, lambda _: "")
    if serving_client():  # the client prints the DOCKER_HOST of where it is: a tunnel's socket
        return
    note(f"Repo {found.ref} is up. Use it with: export DOCKER_HOST={runtime.docker_host_url}")


def _up_foreground(machine: Machine, found: Repo) -> None:
    from rediacc_core.runtime.serve import serve_repo

    runtime = runtime_for(machine, found)
    filesmount.secure_repo(machine, found.id)
    started = lifecycle.start_daemon(machine, found, runtime, detach=False)
    try:
        sockets = (runtime.gate_socket, runtime.upstream_socket)
        status = serve_repo(machine, found, *sockets, runtime.gate_pidfile)
    finally:
        if started is not None:
            started.stop()
    if status:
        raise SystemExit(status)


@click.command("down")
@click.argument("ref", metavar="REPO-REF")
def down(ref: str) -> None:
    """\b
    Examples:
      sudo rdc repo down gpu-a
    """
    machine, found = _resolve(ref)
    # A container that ignores SIGTERM holds this up for the daemon's whole stop timeout.
    try:
        with waiting(f"Stopping repo {found.ref}", only_terminal=True):
            done = lifecycle.repo_down(machine, found)
    except KeyboardInterrupt:
        _say_where_it_stands(machine, found, "stopping")
        raise
    stopped = [what for what in done if not what.startswith(("killed ", "unmounted "))]
    note(
        f"Stopped {', '.join(stopped)} of repo {found.ref}."
        if stopped
        else f"Repo {found.ref} was not running."
    )
    for what in done:
        if what not in stopped:  # what stopping the daemon left behind, now gone
            note(f"  {what[0].upper()}{what[1:]}")


def _say_where_it_stands(machine: Machine, found: Repo, doing: str) -> None:
    """After a Ctrl-C: what of the repo runs now, as `rdc repo list` will say, and the way on."""
    status, running = repo_status(machine, found)
    if not running:
        note(f"Interrupted while {doing} repo {found.ref}: nothing of it runs (down).")
        return
    again = f"`rdc repo down {found.ref}`" + (f" (or `rdc repo up {found.ref}`)" if status != "up" else "")
    note(
        f"Interrupted while {doing} repo {found.ref}: it is {status}, with {', '.join(running)} running; "
        f"stop it with {again}."
    )


@click.command("docker-host")
@click.argument("ref", metavar="REPO-REF")
@output_option("table", "json", "yaml")
def docker_host(ref: str, fmt: str) -> None:
    """`-o json` prints the repo, its id and the DOCKER_HOST.

    \b
    Examples:
      export DOCKER_HOST=$(rdc repo docker-host gpu-a)
      rdc repo docker-host gpu-a -o json
    """
    machine, found = _resolve(ref)
    url = runtime_for(machine, found).docker_host_url
    if fmt == "table":
        click.echo(url)
        return
    emit({"repo": found.ref, "repoId": found.id, "dockerHost": url}, fmt, lambda _: "")


class _GateGroup(HintingGroup):
    """`rdc repo gate REPO` runs the gate (as it always has: systemd's unit says so); `rdc repo gate
    log REPO` reads its audit trail. A first word that is no subcommand is the repo of `run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.list_commands(ctx):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("gate", cls=_GateGroup)
def gate() -> None:
    """\b
    Examples:
      rdc repo gate gpu-a
      rdc repo gate log gpu-a --since 15m
    """


@click.command("run")
@click.argument("ref", metavar="REPO-REF")
def gate_run(ref: str) -> None:
    """\b
    Examples:
      rdc repo gate gpu-a
      rdc repo gate run gpu-a
    """
    from rediacc_core.runtime.serve import serve_repo

    machine, found = _resolve(ref)
    runtime = runtime_for(machine, found)
    filesmount.secure_repo(machine, found.id)  # the gate unit starts without `rdc repo up`
    status = serve_repo(machine, found, runtime.gate_socket, runtime.upstream_socket, runtime.gate_pidfile)
    if status:
        raise SystemExit(status)


@click.command("log")
@click.argument("ref", metavar="REPO-REF")
@click.option("--follow", "-f", is_flag=True, help="Keep printing decisions as they are made.")
@click.option(
    "--since",
    metavar="DURATION|TIMESTAMP",
    help="Only decisions from then on: 15m, 2h, 1d, or 2026-12-01T04:00:00Z.",
)
@output_option("table", "json")
def gate_log(ref: str, follow: bool, since: str | None, fmt: str) -> None:
    """One line per decided or refused request. `-o json` prints each decision as one JSON object per
    line, as the audit log holds it.

    \b
    Examples:
      rdc repo gate log gpu-a
      rdc repo gate log gpu-a --follow
      rdc repo gate log gpu-a --since 2h -o json
    """
    from rediacc_core.gate.audit import read

    machine, found = _resolve(ref)
    start = None
    if since is not None:
        try:
            start = read.parse_since(since)
        except ValueError:
            raise ValidationError(
                f"--since {since!r} is neither a duration nor a timestamp",
                "give a duration such as 15m, 2h or 1d, or a time such as 2026-12-01T04:00:00Z",
            ) from None
    path = runtime_for(machine, found).audit_log
    if not follow and not any(Path(f"{path}{tail}").exists() for tail in ("", ".1")):
        note(f"Repo {found.ref} has no audit log yet ({path}): its gate has decided nothing so far.")
        return
    entries = read.follow_entries(path, start) if follow else read.read_entries(path, start)
    try:
        if fmt == "table" and not follow:  # all at hand: one table, fitted to the terminal
            rows = [_fitted_cells(entry) for entry in entries]
            with fitted(fmt):
                click.echo(table(_FITTED_COLUMNS, rows))
            return
        if fmt == "table":  # a stream (--follow): fixed columns, printed as each decision comes
            click.echo(_GATE_LOG_HEADER)
        for entry in entries:
            click.echo(_gate_log_line(entry) if fmt == "table" else json.dumps(entry, ensure_ascii=False))
    except BrokenPipeError:  # `| head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    except KeyboardInterrupt:
        if not follow:
            raise
        # Ctrl-C is how --follow ends, as `tail -f`: quietly, with the shell's code for SIGINT.
        sys.exit(EXIT_INTERRUPTED)


_GATE_LOG_COLUMNS = ("TIME", "PEER", "METHOD", "ENDPOINT", "DECISION", "RULES", "CDI")
_GATE_LOG_WIDTHS = (24, 22, 7, 26, 13, 16)
_GATE_LOG_HEADER = "  ".join(
    [*(f"{c:<{w}}" for c, w in zip(_GATE_LOG_COLUMNS, _GATE_LOG_WIDTHS, strict=False)), _GATE_LOG_COLUMNS[-1]]
)


# The table of a log read whole: the request in one column, the time to the second in two words,
# so that on an 80-column terminal every cell wraps between words (`-o json` has every detail).
_FITTED_COLUMNS = ("TIME", "PEER", "REQUEST", "DECISION", "RULES", "CDI")


def _fitted_cells(entry: dict[str, Any]) -> list[str]:
    time, peer, method, endpoint, *rest = _gate_log_cells(entry)
    return [time[:19].replace("T", " "), peer, f"{method} {endpoint}", *rest]


def _gate_log_line(entry: dict[str, Any]) -> str:
    *cells, cdi = _gate_log_cells(entry)
    return "  ".join([*(f"{c:<{w}}" for c, w in zip(cells, _GATE_LOG_WIDTHS, strict=True)), cdi])


def _gate_log_cells(entry: dict[str, Any]) -> list[str]:
    """One decision's cells, in `_GATE_LOG_COLUMNS` order."""
    peer = entry.get("peer") or {}
    asked, admitted = entry.get("cdi_asked") or [], entry.get("cdi_admitted") or []
    if entry.get("method") == "rdc":  # something rdc did (a handover): nothing was refused
        cdi = ",".join(asked) or "-"
    else:
        cdi = ",".join(admitted) if admitted else (",".join(asked) + " (refused)" if asked else "-")
    cells = (
        str(entry.get("time", "")),
        f"pid {peer.get('pid', '?')} uid {peer.get('uid', '?')}" + _ssh_cell(peer.get("ssh")),
        str(entry.get("method", "")),
        str(entry.get("endpoint") or entry.get("path", "")),
        f"{entry.get('decision', '?')} {entry.get('status', '')}",
        ",".join(entry.get("rules") or []) or "-",
    )
    return [*cells, cdi]


def _ssh_cell(ssh: object) -> str:
    if not isinstance(ssh, dict):
        return ""
    return f" ssh {ssh.get('user', '?')}@{ssh.get('client', '?')}"


@click.command("dockerd")
@click.argument("ref", metavar="REPO-REF")
def dockerd(ref: str) -> None:
    """\b
    Examples:
      rdc repo dockerd gpu-a
    """
    machine, found = _resolve(ref)
    runtime = runtime_for(machine, found)
    if not runtime.owns_daemon:
        raise StateError(
            f"repo {found.ref} uses the existing daemon {found.docker_host}; rdc runs no dockerd for it",
            "run only its gate unit",
        )
    paths = runtime.daemon_paths
    runtime.data_dir.mkdir(parents=True, exist_ok=True)
    netns.bring_up(runtime.network, machine.root, paths.socket)
    daemon.prepare(machine.root, paths, lifecycle.daemon_guard(found, runtime), runtime.network)
    from rediacc_core.runtime.containerd import start_containerd

    # Its own containerd first (in the unit's cgroup, so stopping the unit stops it too).
    start_containerd(paths, runtime.network)
    argv = daemon.dockerd_argv(paths, network=runtime.network)
    os.execvp(argv[0], argv)


@click.command("units")
@click.argument("ref", metavar="REPO-REF")
@click.option(
    "--install",
    "install_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Also copy the unit templates into this directory (e.g. /etc/systemd/system).",
)
def units(ref: str, install_dir: Path | None) -> None:
    """\b
    Examples:
      rdc repo units gpu-a
      sudo rdc repo units gpu-a --install /etc/systemd/system
    """
    machine, found = _resolve(ref)
    runtime = runtime_for(machine, found)
    if install_dir is not None:
        install_dir.mkdir(parents=True, exist_ok=True)
        for name in UNIT_TEMPLATES:
            text = resources.files("rediacc_core.runtime").joinpath("units", name).read_text(encoding="utf-8")
            (install_dir / name).write_text(text, encoding="utf-8")
        note(f"Installed {', '.join(UNIT_TEMPLATES)} into {install_dir}; run: systemctl daemon-reload")
    instance = found.ref
    names = [f"rediacc-repo-gate@{instance}.service"]
    if runtime.owns_daemon:
        names.insert(0, f"rediacc-repo-dockerd@{instance}.service")
    for name in names:
        click.echo(name)
    enable = "systemctl enable --now " + " ".join(names)
    if install_dir is None and not _units_installed(machine):
        # Enabling instances of templates systemd does not have would fail: install them first.
        note(
            f"The unit templates are not installed: sudo rdc repo units {found.ref} --install "
            f"{machine.path(UNIT_DIRS[0])}, then: systemctl daemon-reload && {enable}"
        )
        return
    note(f"Enable them with: {enable}")


# Where systemd looks for unit files, the operator's own first (what --install is advised into).
UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")


def _units_installed(machine: Machine) -> bool:
    return all(any(machine.path(d).joinpath(n).is_file() for d in UNIT_DIRS) for n in UNIT_TEMPLATES)
