"""`rdc slurm …`: the node's gres.conf and index map, the prolog and epilog slurmd runs, and the
reconciler of grants whose Slurm job has ended."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import emit, note, output_option
from rediacc_core.config import Config
from rediacc_core.errors import RdcError
from rediacc_core.files import atomic_write_text

if TYPE_CHECKING:
    from rediacc_core.slurm.hooks import Outcome


@click.group(cls=HintingGroup)
def slurm() -> None:
    """\b
    Examples:
      rdc slurm gres localhost
      rdc slurm reconcile localhost
    """


@click.command("gres")
@click.argument("name", metavar="MACHINE", default="localhost")
@click.option(
    "--node", help="The machine's Slurm NodeName (default: the machine's name, or this host's for localhost)."
)
@click.option("--conf", default="/etc/slurm/gres.conf", show_default=True, help="Where to write gres.conf.")
@click.option("--dry-run", is_flag=True, help="Print gres.conf and the slurm.conf node line; write nothing.")
@output_option("table", "json")
def gres(name: str, node: str | None, conf: str, dry_run: bool, fmt: str) -> None:
    """Run it after `rdc machine setup` and after every `rdc machine refresh`: until it runs again, a
    machine whose GPUs changed refuses every Slurm lease.

    \b
    Examples:
      rdc slurm gres localhost
      rdc slurm gres localhost --dry-run
      rdc slurm gres lab1 --node gpu-node-1 --conf /etc/slurm/gres.conf
    """
    from rediacc_core.slurm import gres as gresfile

    machine = Config.load().machine(name)
    nodename = node or (os.uname().nodename.split(".")[0] if machine.is_host else machine.name)
    built = gresfile.build(machine, nodename, conf) if dry_run else gresfile.write(machine, nodename, conf)
    line = gresfile.node_line(nodename, built.entries, built.features)
    if fmt == "json":
        emit({**gresfile.map_json(built), "slurmConf": line}, fmt, lambda _: "")
        return
    if dry_run:
        click.echo(gresfile.conf_text(nodename, built.entries, built.generation), nl=False)
    else:
        note(
            f"Wrote {conf} and {gresfile.MAP_PATH} "
            f"({len(built.entries)} GPUs, generation {built.generation})."
        )
    note("In slurm.conf, this node's line needs:")
    click.echo(line)


def _hook_exit(run: Outcome) -> None:
    """A hook's end: what it decided (a refusal included) on stderr, for slurmd's log, and exit 0.
    Only a real fault (an RdcError, below) exits 1: a failing prolog drains the whole node."""
    click.echo(run.line(), err=True)


@click.command("prolog")
@click.argument("name", metavar="MACHINE", default="localhost")
def prolog(name: str) -> None:
    """\b
    Examples:
      rdc slurm prolog localhost        # as slurm.conf's Prolog=, through a script of one line
    """
    from rediacc_core.slurm.hooks import Prolog

    try:
        _hook_exit(Prolog(Config.load().machine(name), dict(os.environ)).run())
    except RdcError as exc:
        click.echo(f"rdc: prolog of job {os.environ.get('SLURM_JOB_ID', '?')} failed: {exc.what}", err=True)
        sys.exit(1)


@click.command("epilog")
@click.argument("name", metavar="MACHINE", default="localhost")
def epilog(name: str) -> None:
    """\b
    Examples:
      rdc slurm epilog localhost        # as slurm.conf's Epilog=, through a script of one line
    """
    from rediacc_core.slurm.hooks import epilog as run_epilog

    try:
        _hook_exit(run_epilog(Config.load().machine(name), dict(os.environ)))
    except RdcError as exc:
        click.echo(f"rdc: epilog of job {os.environ.get('SLURM_JOB_ID', '?')} failed: {exc.what}", err=True)
        sys.exit(1)


@click.command("reconcile")
@click.argument("name", metavar="MACHINE", default="localhost")
@output_option("table", "json")
def reconcile(name: str, fmt: str) -> None:
    """\b
    Examples:
      rdc slurm reconcile localhost
      rdc slurm reconcile localhost -o json
    """
    from rediacc_core.slurm.reconcile import reconcile as run_reconcile

    done = run_reconcile(Config.load().machine(name))
    emit(
        {
            "revoked": [{"repoId": g.repo_id, "device": g.device, "job": g.job} for g in done.revoked],
            "renewed": [
                {"repoId": g.repo_id, "device": g.device, "job": g.job, "until": end}
                for g, end in done.renewed
            ],
        },
        fmt,
        lambda _: "",
    )
    for grant in done.revoked:
        note(f"Revoked {grant.device} (job {grant.job}, which Slurm no longer runs).")
    for grant, end in done.renewed:
        note(f"Renewed {grant.device} until {end} (job {grant.job}'s new end).")


@click.command("health")
@click.argument("name", metavar="MACHINE", default="localhost")
def health(name: str) -> None:
    """\b
    Examples:
      rdc slurm health localhost
      rdc machine gpu clear localhost --device 0000:3b:00.0 && rdc slurm health localhost
    """
    from rediacc_core.cli.gpu_health import unhealthy
    from rediacc_core.slurm.drains import sync

    target = Config.load().machine(name)
    unhealthy(target, scan=True)
    done = sync(target)
    note(f"Slurm: {done}." if done else "Slurm: nothing to change.")


@click.command("bridge")
@click.argument("names", metavar="[MACHINE]...", nargs=-1)
@click.option(
    "--slurm",
    "via",
    default="localhost",
    show_default=True,
    help="The machine whose Slurm tools (squeue, scontrol, scancel) reach the controller.",
)
@click.option("--once", is_flag=True, help="Run one round and exit (non-zero when it fails).")
@click.option(
    "--interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds between rounds (a lease's start waits up to one for its grant).",
)
@click.option(
    "--write-unit",
    "unit",
    metavar="PATH",
    type=click.Path(dir_okay=False, writable=True),
    help="Write a systemd unit that runs this bridge, restarted whenever it stops, instead of running it.",
)
def bridge(names: tuple[str, ...], via: str, once: bool, interval: float, unit: str | None) -> None:
    """\b
    Examples:
      rdc slurm bridge --once
      rdc slurm bridge box1 box2 --interval 5
      rdc slurm bridge box1 box2 --write-unit /etc/systemd/system/rediacc-slurm-bridge.service
    """
    # Here, not at the top: `rdc --help` imports this module, and the bridge's rooms load the CDI
    # schemas and YAML (about 40 ms here).
    from rediacc_core.slurm.bridge import boxes, run_bridge

    config = Config.load()
    machines = [config.machine(n) for n in names] if names else config.machines()
    if unit is not None:
        config.machine(via)  # a name rdc does not know is an error now, not at the unit's start
        _write_unit(Path(unit), [*names, "--slurm", via, "--interval", f"{interval:g}"])
        return
    # Unnamed, the boxes are the machines whose maps this host reads; one over SSH is bridged named.
    bridged = boxes(machines if names else [m for m in machines if m.remote is None])
    if not bridged:
        raise RdcError(
            "no machine to bridge: none has a gres map (a machine over SSH is bridged when named)",
            "rdc slurm gres MACHINE --node NODE --conf /etc/slurm/gres.conf",
        )
    named = [f"{b.node or 'its node over SSH'} ({b.machine.name})" for b in bridged]
    note(f"Bridging {', '.join(named)}.")
    run_bridge(
        config.machine(via),
        bridged,
        lambda line: click.echo(line, err=True),
        interval=interval,
        once=once,
        config=config,
    )


@click.command("bridge-step")
@click.argument("name", metavar="MACHINE", default="localhost")
@click.option("--cluster", required=True, help="The Slurm cluster's name (its grants' tag).")
@click.option(
    "--jobs",
    "jobs_text",
    required=True,
    help="The live jobs the bridge read, as JSON (the bridge writes it); a grant whose job is not "
    "among them is revoked.",
)
@output_option("table", "json")
def bridge_step(name: str, cluster: str, jobs_text: str, fmt: str) -> None:
    """\b
    Examples:
      rdc slurm bridge-step localhost --cluster main --jobs "$(cat live-jobs.json)" -o json
    """
    from rediacc_core.slurm.bridge import read_jobs, step  # as in `bridge`: not for `rdc --help`

    done = step(Config.load().machine(name), cluster, read_jobs(jobs_text))
    emit(done.to_json(), fmt, lambda _: "")
    for outcome in done.done:
        note(outcome.line())


def _write_unit(path: Path, args: list[str]) -> None:
    """A systemd unit running `rdc slurm bridge ARGS` by this rdc's full path, always restarted: a
    bridge that is not running revokes nothing (grants still end at their job's end)."""
    beside = Path(sys.executable).parent / "rdc"  # this installation's own console script
    rdc = str(beside) if beside.is_file() else shutil.which("rdc") or str(Path(sys.argv[0]).resolve())
    text = (
        "# rdc's Slurm bridge (external mode): written by `rdc slurm bridge --write-unit`.\n"
        "[Unit]\nDescription=rediacc Slurm bridge (external mode)\n"
        "After=network-online.target\nWants=network-online.target\n\n"
        f"[Service]\nType=simple\nExecStart={shlex.join([rdc, 'slurm', 'bridge', *args])}\n"
        "Restart=always\nRestartSec=2\n\n[Install]\nWantedBy=multi-user.target\n"
    )
    atomic_write_text(path, text)
    note(
        f"Wrote {path}; start it: systemctl daemon-reload && systemctl enable --now {path.name} "
        f"(its lines: journalctl -u {path.name})."
    )
