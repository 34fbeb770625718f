"""`rdc demo`: set up a simulated machine and list its GPUs, no GPU or Docker needed."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from rediacc_core.cli import output
from rediacc_core.cli.machine_gpu import live_grants, render_gpu_table
from rediacc_core.cli.output import TerminalProgress, note
from rediacc_core.config import Config
from rediacc_core.errors import StateError
from rediacc_core.inventory import load_inventory
from rediacc_core.machine import Machine


@click.command("demo")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where to build the simulated machine (default: where the last demo was, else a new temporary "
    "directory).",
)
@click.option(
    "--stop",
    is_flag=True,
    help="Stop the demo machine's running repos first (`rdc repo down` of each), instead of refusing.",
)
def demo(workdir: Path | None, stop: bool) -> None:
    """It is a walkthrough, so everything but warnings goes to stdout, in order. Run again, it rebuilds
    the demo machine where it was rather than leaving one temporary directory per run. It rebuilds
    (or moves) a demo machine only while none of its repos runs: it refuses, naming each, unless
    --stop, which stops them first.

    \b
    Examples:
      rdc demo
      rdc demo --stop
      REDIACC_CONFIG=/tmp/rdc.yaml rdc demo --workdir /tmp/rdc-demo
    """
    # Here, not at the top: `rdc --help` lists this command without loading the walkthrough.
    from rediacc_core.demo import DEMO_MACHINE, build_demo_machine, is_demo_root, walkthrough
    from rediacc_core.plugins import get_plugins
    from rediacc_core.setup import run_setup

    config = Config.load()
    old_root = config.machine(DEMO_MACHINE, present=False).root if config.has(DEMO_MACHINE) else None
    if old_root is not None and old_root.is_dir():
        # Before anything is deleted or re-pointed: what runs there must be stopped, not orphaned.
        _stop_or_refuse(config.machine(DEMO_MACHINE), stop)
    if workdir is None:
        reusable = old_root is not None and is_demo_root(old_root)
        workdir = old_root.parent if reusable and old_root else Path(tempfile.mkdtemp(prefix="rdc-demo-"))
    built = build_demo_machine(workdir)
    fake = built.fake
    for problem in built.problems:
        note(f"Warning: {problem}")
    if built.layouts:
        click.echo(f"Simulated machine at {fake.root} with hardware from: {', '.join(built.layouts)}")
    else:
        click.echo(f"Simulated machine at {fake.root}; no plugin offers a demo layout, so it has no GPUs.")
    if old_root is not None:
        if old_root != fake.root and old_root.exists() and not is_demo_root(old_root):
            raise StateError(
                f"a machine named {DEMO_MACHINE!r} already exists with root {old_root}, "
                "not made by `rdc demo`",
                f"remove it with `rdc machine remove {DEMO_MACHINE}`, "
                "or point REDIACC_CONFIG at another file",
            )
        config.remove(DEMO_MACHINE)
        if old_root != fake.root and old_root.exists():
            note(f"The demo machine moves from {old_root} to {fake.root}; {old_root} is left as it was.")
    target = config.add(DEMO_MACHINE, fake.root)
    config.save()

    plugins = get_plugins()
    ctx = click.get_current_context()
    options: dict[str, Any] = {opt.name: opt.get_default(ctx) for opt in plugins.setup_options() if opt.name}
    # The stand-in vendor tools lie under the machine's root, where setup looks for its tools: the
    # same `rdc machine setup demo` works afterwards from any shell.
    report = run_setup(target, plugins, options, progress=TerminalProgress(sys.stdout))
    for warning in report.warnings:
        note(f"Warning: {warning}")
    click.echo("")
    click.echo(render_gpu_table(load_inventory(target) or {}, live_grants(target)))
    click.echo("")
    click.echo("Grants and the gate (decisions asked of the gate's engine, as `docker run` would send them):")
    for step in walkthrough(target, plugins):
        mark = "ok " if step.ok else "no "
        click.echo(f"  {mark} $ {step.command}")
        for line in step.outcome.splitlines():
            click.echo(f"        {line}")
    click.echo("")
    # A config other than the default must be named, or the next command would not find `demo`.
    rdc = output.rdc_as_typed()
    click.echo(f"Next: {rdc} machine gpu list {DEMO_MACHINE}   # grants now in force")
    click.echo(f"      {rdc} repo gpu list alpha@{DEMO_MACHINE}")
    click.echo(f"      {rdc} machine setup {DEMO_MACHINE}   # setup again: its tools are under its root")


def _stop_or_refuse(machine: Machine, stop: bool) -> None:
    """Stop the demo machine's running repos (`--stop`), or refuse naming them: rebuilding its root
    under a running daemon fails half-way (its mounts are busy) and orphans the daemon."""
    from rediacc_core.runtime import lifecycle

    if not stop:
        lifecycle.refuse_while_running(machine, "rebuilding the demo machine", instead="rdc demo --stop")
        return
    for repo, _parts in lifecycle.running_repos(machine):
        for what in lifecycle.repo_down(machine, repo):
            note(f"  {what[0].upper()}{what[1:]}")
        note(f"Stopped repo {repo.ref}.")


def runnable_rdc() -> str:
    """How to run this rdc from the user's shell (see `output.runnable_rdc`)."""
    return output.runnable_rdc()
