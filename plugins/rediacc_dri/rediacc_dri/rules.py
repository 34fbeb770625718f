"""Gate rule: a raw `/dev/dri` device is refused, naming the `rediacc.io/dri` device to use."""

from __future__ import annotations

import re

from rediacc_core import (
    ApiRequest,
    GateContext,
    Inventory,
    Machine,
    Refusal,
    Verdict,
    is_at_or_under,
    landing_paths,
)
from rediacc_dri.discovery import KIND, SOURCE, render_node_of_card, render_nodes, render_nodes_of_pci

DRI_DIR = "/dev/dri"
RULE = "raw-device"  # the core's generic rule: our refusal replaces its message
RENDER = re.compile(r"^renderD(\d+)$")
CARD = re.compile(r"^card(\d+)$")
BY_PATH = re.compile(r"^pci-([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])-(render|card)$")


def request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for raw in request.raw_device_paths():
        landed = [p for p in landing_paths(ctx.machine, raw) if is_at_or_under(p, DRI_DIR)]
        if landed:
            verdicts.append(_refusal(raw, landed[-1], ctx))
    return verdicts


def suggested_names(machine: Machine, path: str) -> list[str]:
    """The `rediacc.io/dri` names that give a container what the raw `path` under /dev/dri would."""
    rest = path[len(DRI_DIR) :].strip("/")
    if not rest:
        return [node.cdi_name for node in render_nodes(machine)]  # the whole directory
    leaf = rest.split("/")[-1]
    if m := RENDER.match(leaf):
        return [f"{KIND}=renderD{m.group(1)}"]
    if m := CARD.match(leaf):
        node = render_node_of_card(machine, int(m.group(1)))
        return [node.cdi_name] if node else []
    if m := BY_PATH.match(leaf):
        return [n.cdi_name for n in render_nodes_of_pci(machine, m.group(1))]
    return []


def _refusal(raw: str, path: str, ctx: GateContext) -> Refusal:
    names = suggested_names(ctx.machine, path)
    shown = raw if raw == path else f"{raw} (which is {path})"
    message = (
        f"raw device {shown} is refused: a container reaches host devices only through CDI names "
        f"granted to its repo"
    )
    if not names:
        message += f"; `rdc machine gpu list {ctx.machine.name}` shows the {KIND} names of this machine"
        return Refusal(message, replacement=f"--device {KIND}=renderD<N>", rule=RULE, subject=raw)
    missing = [n for n in names if n not in ctx.grants]
    if missing:
        devices = " ".join(f"--device {n}" for n in missing)
        message += f"; grant it first: rdc repo gpu grant {ctx.repo_ref} {devices}"
    others = _other_names(ctx.inventory, names)
    if others:
        message += f" (these devices include the same render node: {', '.join(others)})"
    return Refusal(message, replacement=" ".join(f"--device {n}" for n in names), rule=RULE, subject=raw)


def _other_names(inventory: Inventory | None, names: list[str]) -> list[str]:
    """Names other plugins publish for GPUs on the same render nodes (e.g. a compute device)."""
    found: list[str] = []
    for minor in sorted({int(n.rsplit("renderD", 1)[1]) for n in names}):
        for gpu in inventory.with_attribute("renderMinor", minor) if inventory is not None else ():
            if gpu.source != SOURCE:
                found += [n for n in gpu.cdi_names if n not in found]
    return found
