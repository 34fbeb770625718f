"""`rdc machine …`: register machines, set them up, and list their GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import (
    TerminalProgress,
    emit,
    note,
    output_option,
    rdc_as_typed,
    table,
)
from rediacc_core.config import Config
from rediacc_core.errors import RdcError, StateError, ValidationError
from rediacc_core.inventory import age, load_inventory
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    from rediacc_core.setup import SetupReport

# The reads here (list, gpu list, config) import only the above; setup (plugins, CDI specs) is
# imported by the command that runs it.


@click.group(cls=HintingGroup)
def machine() -> None:
    """\b
    Examples:
      rdc machine list
      rdc machine add lab1 --root /srv/lab1
      rdc machine setup lab1
    """


# --- registry of machines ---------------------------------------------------------------------


@click.command("add")
@click.argument("name")
@click.option(
    "--root",
    help="The machine's filesystem root (/sys, /dev, /etc … are read and written under it); with --ssh, "
    "a directory on that machine (default /).",
)
@click.option(
    "--ssh", "ssh", metavar="[USER@]HOST[:PORT]", help="Reach the machine over SSH (OpenSSH client)."
)
@click.option("--identity", metavar="FILE", help="With --ssh: the private key to log in with.")
@click.option("--accept-host-key", is_flag=True, help="With --ssh: trust the key the host presents now.")
def add(name: str, root: str | None, ssh: str | None, identity: str | None, accept_host_key: bool) -> None:
    """\b
    Examples:
      rdc machine add lab1 --root /srv/lab1
      rdc machine add gpu-box --ssh root@gpu-box.example
    """
    config = Config.load()
    if ssh is not None:
        from rediacc_core.cli.machine_ssh import add_ssh_machine

        add_ssh_machine(config, name, ssh, identity, root, accept_host_key)
        return
    if root is None or identity is not None or accept_host_key:
        raise ValidationError(
            "a local machine needs --root DIR (--identity and --accept-host-key go with --ssh)",
            f"e.g. rdc machine add {name} --root /srv/sim/{name}, or --ssh root@host",
        )
    added = config.add(name, Path(root))
    config.save()
    note(f"Added machine {added.name} with root {added.root}.")
    note(f"Next: rdc machine setup {added.name}")


@click.command("list")
@output_option()
def list_machines(fmt: str) -> None:
    """\b
    Examples:
      rdc machine list
      rdc machine list -o json
    """
    config = Config.load()
    rows = [_machine_row(m, fmt) for m in config.machines()]
    for name in config.names():
        note_old_settings(config, name)
    if config.path.is_file() and not config.entries:
        # An empty file (or one another $REDIACC_CONFIG points at by mistake) is said, not silent.
        note(
            f"Note: the client config {config.path} names no machines, so only localhost is listed; "
            "add one with `rdc machine add NAME --ssh root@HOST` (or `--root DIR`)."
        )
    emit(
        rows,
        fmt,
        lambda data: table(
            ["NAME", "ROOT", "PLATFORM", "SETTINGS", "INVENTORY"],
            [
                [
                    r["name"],
                    r["root"],
                    r["platform"],
                    r["settings"] if isinstance(r["settings"], str) else _settings_text(r["settings"]),
                    r["inventory"],
                ]
                for r in data
            ],
        ),
    )


def _settings_text(settings: Mapping[str, str] | None) -> str | None:
    return ", ".join(f"{k}={v}" for k, v in (settings or {}).items()) or None


def _machine_row(m: Machine, fmt: str) -> dict[str, Any]:
    if m.remote is not None:  # not asked over the network: the listing stays fast and offline
        # A table says so, and how to ask; the data for scripts keeps null (unknown).
        asked = None if fmt != "table" else "not asked"
        return {
            "name": m.name,
            "root": f"{m.remote}:{m.root}",
            "platform": asked,
            "settings": None if asked is None else f"{asked}: rdc machine config {m.name}",
            "inventory": None if asked is None else f"{asked}: rdc machine gpu list {m.name}",
            "ssh": str(m.remote),
        }
    try:
        inventory = load_inventory(m)
        if not m.root.is_dir():
            state = "root missing"
        elif inventory is None:
            state = "not set up"
        elif fmt == "table":
            state = f"written {age(inventory['generatedAt'])}"
        else:
            state = f"written {inventory['generatedAt']}"  # data for scripts: the time, not "just now"
    except RdcError:
        state = "unreadable"
    from rediacc_core.settings import read_settings  # only the list reads them: `machine gpu` does not

    settings: dict[str, str] | str
    try:
        settings = read_settings(m)  # a machine whose root is gone has no file: the defaults
    except RdcError:
        settings = "unreadable"  # `rdc machine config NAME` says why
    return {
        "name": m.name,
        "root": str(m.root),
        "platform": m.platform,
        "settings": settings,
        "inventory": state,
    }


def note_old_settings(config: Config, name: str) -> None:
    old = config.old_settings(name)
    if old:
        sets = " ".join(f"--set {k}={v}" for k, v in old.items())
        note(
            f"Note: {config.path} still holds settings for machine {name} ({_settings_text(old)}) from an "
            f"older rdc; they have no effect: settings live on the machine now. To keep them, run "
            f"`rdc machine config {name} {sets}`."
        )


@click.command("remove")
@click.argument("name")
def remove(name: str) -> None:
    """\b
    Examples:
      rdc machine remove lab1
    """
    config = Config.load()
    target = config.machine(name, present=False)  # a machine whose root vanished can be forgotten
    if target.remote is None and target.root.is_dir():
        from rediacc_core.runtime.lifecycle import refuse_while_running

        refuse_while_running(target, f"forgetting machine {name}")
    config.remove(name)
    config.save()
    if target.remote is not None:
        from rediacc_core.cli.machine_ssh import forget_ssh_machine

        forget_ssh_machine(config, target)
    where = f"{target.remote}:{target.root}" if target.remote is not None else str(target.root)
    note(f"Removed machine {name}; nothing under {where} was changed.")


# --- setup ------------------------------------------------------------------------------------


class _SetupCommand(click.Command):
    """`setup` with the options the plugins contribute, asked for when the command is parsed."""

    _clashes: ClassVar[set[str]] = set()

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)
        taken = {p.name for p in params}
        from rediacc_core.plugins import get_plugins

        for option in get_plugins().setup_options():
            if option.name in taken:
                # Said once per process: click asks for the parameters several times per call.
                if option.name not in self._clashes:
                    self._clashes.add(str(option.name))
                    note(f"Warning: ignoring a plugin's setup option {option.opts[0]}: the name is taken")
                continue
            taken.add(option.name)
            params.append(option)
        return params


@click.command("setup", cls=_SetupCommand)
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Print the plan (each command, each file) and change nothing.")
def setup(name: str, dry_run: bool, **options: Any) -> None:
    """\b
    Examples:
      rdc machine setup localhost --dry-run
      sudo rdc machine setup localhost
      rdc machine setup lab1 --help          # the options the installed plugins add
    """
    target = Config.load().machine(name)
    from rediacc_core.plugins import get_plugins
    from rediacc_core.setup import run_setup

    report = run_setup(
        target, get_plugins(), options, dry_run=dry_run, progress=None if dry_run else TerminalProgress()
    )
    print_result(report, dry_run)
    _follow_slurm(target, dry_run)


@click.command("refresh")
@click.argument("name", default="localhost")
@click.option("--dry-run", is_flag=True, help="Print the plan and change nothing.")
def refresh(name: str, dry_run: bool) -> None:
    """\b
    Examples:
      rdc machine refresh localhost --dry-run
      sudo rdc machine refresh localhost
    """
    target = Config.load().machine(name)
    if target.remote is None and not target.inventory_path.exists():
        # Refresh follows a machine that is set up; on one never set up it would make /etc/rediacc.
        raise StateError(
            f"machine {name} has not been set up: there is no {target.inventory_path} to refresh",
            f"run `rdc machine setup {name}`",
        )
    from rediacc_core.plugins import get_plugins
    from rediacc_core.setup import run_setup

    report = run_setup(
        target,
        get_plugins(),
        {},
        dry_run=dry_run,
        progress=None if dry_run else TerminalProgress(),
        refresh=True,
    )
    print_result(report, dry_run)
    _follow_slurm(target, dry_run)


def _follow_slurm(target: Machine, dry_run: bool) -> None:
    """A Slurm node's gres.conf follows the new inventory; grants of ended jobs go."""
    if dry_run:
        return
    from rediacc_core.slurm.follow import after_setup

    for line in after_setup(target):
        note(line)


def print_result(report: SetupReport, dry_run: bool) -> None:
    """What setup or refresh did (or, on a dry run, would do), the same way for both."""
    name = report.machine.name
    if dry_run:
        print_plan(report)
        if report.refusal is not None:  # exit as the real run would, saying why
            raise report.refusal
        return
    for warning in report.warnings:
        note(f"Warning: {warning}")
    from rediacc_core.cli.machine_gpu import cards_without_names  # the GPU tables' reading of a card

    inventory = report.inventory or {}
    unnamed = cards_without_names(inventory)
    why = (
        f"; {len(unnamed)} GPU(s) no CDI spec names, so not grantable ({', '.join(unnamed)}): "
        f"rdc machine setup {name} --dry-run says why"
        if unnamed
        else ""
    )
    stale = inventory.get("ungrantable", [])
    if stale:
        why += (
            f"; {len(stale)} CDI name(s) a spec defines are not grantable, no discovered hardware is them "
            f"(rdc machine gpu list {name} says why)"
        )
    done = "refreshed" if report.refresh else "set up"
    note(
        f"Machine {name} is {done}: {report.cards} GPU(s), {len(inventory.get('devices', []))} grantable "
        f"CDI device(s){why}; inventory at {report.machine.inventory_path}."
    )
    for row in stale:
        note(f"  not grantable: {row['name']}: {row['why']}")
    for path in report.written:
        note(f"  wrote {path}")
    for path in report.removed:
        note(f"  removed {path}")
    _report_grant_changes(report)
    note(f"Next: {rdc_as_typed()} machine gpu list {name}")


def _report_grant_changes(report: SetupReport) -> None:
    """What the re-check of the grants did: every suspension with its drift and the way out."""
    from rediacc_core.grants.records import suspension_advice
    from rediacc_core.recheck import SUSPENDED, change_text

    for change in report.grant_changes:
        if change.what == SUSPENDED:
            advice = suspension_advice(change.grant, change.repo_ref)
            note(f"  Warning: grant {change_text(change)}; it reaches nothing until resolved: {advice}")
        else:
            note(f"  grant {change_text(change)}")


def print_plan(report: SetupReport) -> None:
    note(f"Dry run for machine {report.machine.name}: nothing was changed. The plan:")
    lines = []
    for number, step in enumerate(report.plan, 1):
        lines.append(f"{number}. {step.title}")
        lines.extend(f"   {line}" for line in step.lines)
    click.echo("\n".join(lines))
