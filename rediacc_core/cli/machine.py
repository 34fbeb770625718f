"""`rdc machine …`: register machines, set them up, and list their GPUs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click

from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import (
    TerminalProgress,
    emit,
    fitted,
    fitted_width,
    note,
    output_option,
    rdc_as_typed,
    table,
)
from rediacc_core.config import Config
from rediacc_core.errors import RdcError, StateError, ValidationError
from rediacc_core.grants.records import prune_orphans, read_grants
from rediacc_core.inventory import age, load_inventory, read_inventory_text
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.settings import SETTINGS, change_settings, read_settings

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
        _note_old_settings(config, name)
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


def _note_old_settings(config: Config, name: str) -> None:
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


def _settings_help(text: str | None) -> str:
    """The command's help with every setting listed: what it accepts and its default."""
    lines = ["\b", "Settings (default in brackets):"]
    lines += [f"  {s.name}={s.values}  [{s.default or 'none'}]" for s in SETTINGS.values()]
    return (text or "").replace("{settings}", "\n    ".join(lines))  # the docstring's indent


@click.command("config")
@click.argument("name")
@click.option("--set", "assignments", multiple=True, metavar="KEY=VALUE", help="Set a per-machine setting.")
@click.option("--unset", "unset", multiple=True, metavar="KEY", help="Go back to a setting's default.")
@output_option()
def configure(name: str, assignments: tuple[str, ...], unset: tuple[str, ...], fmt: str) -> None:
    """Settings are kept on the machine, in /etc/rediacc/settings.json under its root; running repo
    gates apply a change at their next request.

    {settings}

    \b
    Examples:
      rdc machine config localhost
      rdc machine config localhost --set legacy-visible-devices=translate
      rdc machine config localhost --unset legacy-visible-devices
    """
    config = Config.load()
    target = config.machine(name)
    changes: list[tuple[str, str | None]] = []
    for assignment in assignments:
        key, sep, value = assignment.partition("=")
        if not sep or not key:
            raise ValidationError(
                f"--set expects KEY=VALUE, got {assignment!r}",
                "for example: --set legacy-visible-devices=translate",
            )
        changes.append((key.strip(), value.strip()))
    changes += [(key, None) for key in unset]
    if changes:
        settings = change_settings(target, changes)
        if config.forget_old_settings(name):
            config.save()
            note(f"Removed the old settings of machine {name} from {config.path}: they live on the machine.")
        if fmt != "json":  # a change prints nothing on stdout unless asked, as every changing command
            for key, given in changes:
                now = settings.get(key, SETTINGS[key].default) or "none"
                note(f"Machine {name}: {key}={now}" + ("" if given is not None else " (its default)"))
            return
    else:
        _note_old_settings(config, name)
        settings = read_settings(target)
    rows = [
        {
            "setting": s.name,
            "value": settings.get(s.name, s.default),
            "source": "machine" if s.name in settings else "default",
            "choices": list(s.choices),
        }
        for s in SETTINGS.values()
    ]
    emit(
        rows,
        fmt,
        lambda data: table(
            ["SETTING", "VALUE", "SOURCE", "ACCEPTS"],
            [
                [
                    r["setting"],
                    r["value"] or "-",
                    r["source"],
                    SETTINGS[r["setting"]].values,
                ]
                for r in data
            ],
        ),
    )


configure.help = _settings_help(configure.help)


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
    inventory = report.inventory or {}
    unnamed = _cards_without_names(inventory)
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


# --- GPUs -------------------------------------------------------------------------------------


@click.group("gpu", cls=HintingGroup)
def gpu() -> None:
    """\b
    Examples:
      rdc machine gpu list localhost
      rdc machine gpu clear localhost --device 0000:3b:00.0
      rdc machine gpu prune localhost
    """


@click.command("list")
@click.argument("name", required=False)
@click.option("--all", "every", is_flag=True, help="Every machine at once, one row per GPU.")
@click.option(
    "--scan",
    is_flag=True,
    help="Read the drivers' health events (the kernel's log) now, not only those the gates recorded.",
)
@output_option()
def gpu_list(name: str | None, every: bool, scan: bool, fmt: str) -> None:
    """`-o json` prints the inventory exactly as it is recorded on the machine.

    \b
    Examples:
      rdc machine gpu list localhost
      rdc machine gpu list localhost --scan
      rdc machine gpu list localhost -o json
    """
    if every or name is None:
        from rediacc_core.cli.fleet import fleet_gpu_list

        fleet_gpu_list(name, every, fmt)
        return
    target = Config.load().machine(name)
    text = read_inventory_text(target)
    if text is None:
        raise StateError(
            f"machine {name} has not been set up: there is no {target.inventory_path}",
            f"run `rdc machine setup {name}`",
        )
    from rediacc_core.cli.gpu_health import health_section, held_back_note, unhealthy

    if fmt in ("json", "yaml"):
        # The inventory as recorded; what holds a card back is not in it, so it is said beside it.
        if fmt == "json":
            click.echo(text.rstrip("\n"))
        else:
            emit(load_inventory(target) or {}, fmt, lambda _: "")
        for line in held_back_note(target, unhealthy(target, scan=scan)):
            note(line)
        return
    inventory = load_inventory(target) or {}

    with fitted(fmt):
        held = unhealthy(target, scan=scan)
        click.echo(render_gpu_table(inventory, live_grants(target)) + health_section(target, held))
    for line in suspended_lines(target):
        note(line)
    for line in ended_lease_lines(target):
        note(line)


def ended_lease_lines(target: Machine) -> list[str]:
    """A line per lease that ended within a day (`records.ended_leases`), with the grant that brings
    it back."""
    from rediacc_core.grants.records import ended_leases, read_all
    from rediacc_core.repos import RepoStore

    refs = {repo.id: repo.ref for repo in RepoStore(target).list()}
    return [
        f"The lease of {e.device} to {refs[e.repo_id]} ended at {e.expires_at}; grant it anew: "
        f"rdc repo gpu grant {refs[e.repo_id]} --device {e.device} --for 8h"
        for e in ended_leases(read_all(target))
        if e.repo_id in refs
    ]


@click.command("clear")
@click.argument("name")
@click.option(
    "--device",
    metavar="BUS_ID|CDI_NAME",
    help="The GPU to clear, by PCI bus id or by a CDI name reaching it (default: every GPU).",
)
@output_option()
def gpu_clear(name: str, device: str | None, fmt: str) -> None:
    """The events stay recorded as cleared: the same kernel log line read again holds nothing back.

    \b
    Examples:
      rdc machine gpu clear localhost --device 0000:3b:00.0
      rdc machine gpu clear localhost --device vendor.example/gpu=0
      rdc machine gpu clear localhost
    """
    from rediacc_core.cli.gpu_health import clear_health

    target = Config.load().machine(name)
    cleared = clear_health(target, device)
    data = [
        {
            "pciBusId": r.event.pci_bus_id,
            "reason": r.event.reason,
            "message": r.event.message,
            "seenAt": r.seen_at,
        }
        for r in cleared
    ]
    if fmt in ("json", "yaml"):
        emit(data, fmt, lambda _: "")
        return
    for card in dict.fromkeys(r.event.pci_bus_id for r in cleared):
        reasons = ", ".join(dict.fromkeys(r.event.reason for r in cleared if r.event.pci_bus_id == card))
        note(f"Cleared the GPU at {card} ({reasons}): containers holding it may start again.")
    if not cleared:
        which = f"that {device} names " if device else ""
        note(f"No GPU {which}is held back for its health on {name}: nothing to clear.")
    if cleared:
        _follow_slurm(target, False)  # a Slurm node drained for these cards is resumed


def suspended_lines(target: Machine) -> list[str]:
    """One line per suspended grant of the machine: the drift, and the commands that resolve it."""
    from rediacc_core.grants.records import suspension_advice, suspension_text

    suspended = [g for g in read_grants(target) if g.suspended is not None]
    refs = {repo.id: repo.ref for repo in RepoStore(target).list()} if suspended else {}
    lines = []
    for grant in sorted(suspended, key=lambda g: (refs.get(g.repo_id, g.repo_id), g.device)):
        ref = refs.get(grant.repo_id, f"deleted repo {grant.repo_id}")
        lines.append(f"Suspended: {suspension_text(grant, ref)}; {suspension_advice(grant, ref)}.")
    return lines


@click.command("prune")
@click.argument("name")
@output_option()
def gpu_prune(name: str, fmt: str) -> None:
    """\b
    Examples:
      rdc machine gpu prune localhost
      rdc machine gpu prune localhost -o json
    """
    target = Config.load().machine(name)
    gone = prune_orphans(target)
    data = [{"repoId": g.repo_id, "device": g.device, "exclusive": g.exclusive} for g in gone]
    if fmt in ("json", "yaml"):
        emit(data, fmt, lambda _: "")
        return
    for grant in gone:
        note(f"Removed {grant.device} from deleted repo {grant.repo_id}.")
    if not gone:
        note(f"No grants of deleted repos on {name}.")


def live_grants(target: Machine) -> dict[str, list[str]]:
    """Device name -> holders such as `alpha:gpu (exclusive)`, read from the machine now."""
    grants = read_grants(target)
    # An unreadable repos file is an error here as in every other command, never "unknown repo".
    labels = {repo.id: repo.label for repo in RepoStore(target).list()} if grants else {}
    held: dict[str, list[str]] = {}
    for grant in grants:
        holder = labels.get(grant.repo_id, f"{grant.repo_id} (deleted repo: rdc machine gpu prune)")
        marks = [*(["exclusive"] if grant.exclusive else []), *(["suspended"] if grant.suspended else [])]
        holder += f" ({', '.join(marks)})" if marks else ""
        held.setdefault(grant.device, []).append(holder)
    return held


# The long forms of a name (a card's or a partition's UUID): on a narrow terminal they are left to
# the CDI DEVICE table, where each name has a line of its own.
_UUID_NAME = re.compile(r"=(GPU|MIG)-[0-9a-fA-F-]+$")


def render_gpu_table(inventory: Mapping[str, Any], grants: Mapping[str, list[str]]) -> str:
    """The GPUs and CDI devices of `inventory`; on a terminal narrower than that, the columns that
    repeat what is said elsewhere are left out (the platform, the driver, the UUID names in the GPU
    table, the spec files), with a line saying `-o wide` shows them."""
    full = _gpu_tables(inventory, grants, narrow=False)
    width = fitted_width()
    if width is None or max(map(len, full.splitlines()), default=0) <= width:
        return full
    return (
        _gpu_tables(inventory, grants, narrow=True) + "\n(fitted to the terminal: -o wide shows every column)"
    )


def _gpu_tables(inventory: Mapping[str, Any], grants: Mapping[str, list[str]], *, narrow: bool) -> str:
    def shown(found: list[str]) -> list[str]:
        return [n for n in found if not (narrow and _UUID_NAME.search(n))] or found

    width = fitted_width()

    generated = str(inventory.get("generatedAt", ""))
    out = [
        f"Machine {inventory.get('machine')}: platform {inventory.get('platform')}, "
        f"inventory written {age(generated)} ({generated})",
        "",
    ]
    gpus = _one_per_card(inventory.get("gpus", []))
    if gpus:
        rows: list[list[object]] = []
        for g in gpus:
            rows.append(
                [
                    g.get("index"),
                    g.get("name"),
                    g.get("vendor"),
                    g.get("driverVersion"),
                    _mib(g.get("memoryMiB")),
                    inventory.get("platform"),
                    g.get("pciBusId"),
                    ", ".join(shown(g.get("cdiNames", []))) or "(none: no CDI spec names it)",
                ]
            )
            for p in g.get("partitions", []):
                rows.append(
                    [
                        f"└ {p.get('index')}",
                        p.get("profile") or "partition",
                        "",  # a partition shares its GPU's vendor, driver, platform and bus
                        "",
                        _mib(p.get("memoryMiB")),
                        "",
                        "",
                        ", ".join(shown(p.get("cdiNames", []))) or None,
                    ]
                )
        headers = ["GPU", "NAME", "VENDOR", "DRIVER", "MEMORY", "PLATFORM", "PCI BUS ID", "CDI NAMES"]
        if narrow:  # the platform is in the line above; the driver in -o wide
            rows = [[r[0], r[1], r[2], r[4], r[6], r[7]] for r in rows]
            headers = ["GPU", "NAME", "VENDOR", "MEMORY", "PCI BUS ID", "CDI NAMES"]
        out.append(table(headers, rows, width=width))
    else:
        out.append("GPUs: none found")
    out.append("")
    devices = inventory.get("devices", [])
    names = {d["name"] for d in devices}
    device_rows: list[list[object]] = [
        [d["name"], d.get("spec"), ", ".join(grants.get(d["name"], [])) or None] for d in devices
    ]
    # Names a spec defines that no discovered hardware is: listed with why, never as grantable.
    stale = {d["name"]: d for d in inventory.get("ungrantable", [])}
    for device, row in sorted(stale.items()):
        held = ", ".join(grants.get(device, []))
        device_rows.append([device, f"{row.get('spec')} (not grantable: {row.get('why')})", held or None])
    # A grant whose name no spec defines any more (hardware gone, toolkit off) is shown, not hidden.
    for device, holders in sorted(grants.items()):
        if device not in names and device not in stale:
            device_rows.append([device, "(not defined on the machine)", ", ".join(holders)])
    if device_rows and narrow:
        out.append(table(["CDI DEVICE", "GRANTED TO"], [[r[0], r[2]] for r in device_rows], width=width))
    elif device_rows:
        out.append(table(["CDI DEVICE", "SPEC", "GRANTED TO"], device_rows, width=width))
    else:
        out.append("Grantable CDI devices: none")
    return "\n".join(out)


def _cards_without_names(inventory: Mapping[str, Any]) -> list[str]:
    """The cards of the inventory that no CDI spec names (no grantable name reaches them)."""
    return [
        f"{g.get('name')} at {g.get('pciBusId')}" if g.get("pciBusId") else str(g.get("name"))
        for g in _one_per_card(inventory.get("gpus", []))
        if not g.get("cdiNames")
    ]


def _one_per_card(gpus: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """One row per card: where two plugins report the same PCI device (a vendor plugin's GPU and a
    render-node plugin's node of it), the fuller record leads and the CDI names of both are shown."""
    cards: dict[str, list[Mapping[str, Any]]] = {}
    alone: list[list[Mapping[str, Any]]] = []
    for gpu in gpus:
        bus = gpu.get("pciBusId")
        if bus:
            if bus not in cards:
                cards[bus] = []
                alone.append(cards[bus])
            cards[bus].append(gpu)
        else:
            alone.append([gpu])
    merged: list[Mapping[str, Any]] = []
    for same in alone:
        lead = max(same, key=lambda g: sum(v not in (None, "", [], {}) for v in g.values()))
        names = [n for g in [lead, *same] for n in g.get("cdiNames", [])]
        parts = [p for g in same for p in g.get("partitions", [])]
        merged.append({**lead, "cdiNames": list(dict.fromkeys(names)), "partitions": parts})
    return merged


def _mib(value: object) -> str | None:
    return f"{value} MiB" if isinstance(value, int) else None
