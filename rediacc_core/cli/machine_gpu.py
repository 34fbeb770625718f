"""`rdc machine gpu …`: a machine's GPUs as its inventory records them, with what each is granted to
and what holds one back (`list`), and the records that clear or prune them (`clear`, `prune`).

Apart from `rdc machine`'s other commands, so `rdc machine list` loads none of the grant records
this module reads.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import click

from rediacc_core.cli.gpu_health import clear_health, health_section, held_back_note, unhealthy
from rediacc_core.cli.groups import HintingGroup
from rediacc_core.cli.output import emit, fitted, fitted_width, note, output_option, table
from rediacc_core.config import Config
from rediacc_core.errors import StateError
from rediacc_core.grants.records import (
    ended_leases,
    prune_orphans,
    read_all,
    read_grants,
    suspension_advice,
    suspension_text,
)
from rediacc_core.inventory import age, load_inventory, read_inventory_text
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore


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
    if cleared:  # a Slurm node drained for these cards is resumed
        from rediacc_core.slurm.follow import after_setup

        for line in after_setup(target):
            note(line)


def suspended_lines(target: Machine) -> list[str]:
    """One line per suspended grant of the machine: the drift, and the commands that resolve it."""
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


def cards_without_names(inventory: Mapping[str, Any]) -> list[str]:
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
