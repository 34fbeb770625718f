"""Gate rule: a raw `/dev/kfd` is refused, naming the `rediacc.io/amd` device to use instead."""

from __future__ import annotations

import re

from rediacc_amd.discovery import KFD_NODE, KIND, SOURCE, amd_gpus, cdi_name
from rediacc_core import ApiRequest, GateContext, Refusal, Verdict, landing_paths

RULE = "raw-device"  # the core's generic rule: our refusal replaces its message
RENDER_PATH = re.compile(r"^/dev/dri/renderD(\d+)$")


def request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    raw_paths = request.raw_device_paths()
    landed = {raw: landing_paths(ctx.machine, raw) for raw in raw_paths}
    kfd_entries = [raw for raw, paths in landed.items() if KFD_NODE in paths]
    if not kfd_entries:
        return []
    minors = {int(m.group(1)) for paths in landed.values() for p in paths if (m := RENDER_PATH.match(p))}
    gpus = _gpus(ctx)
    return [_refusal(raw, landed[raw][-1], gpus, minors, ctx) for raw in kfd_entries]


def _gpus(ctx: GateContext) -> list[tuple[int, int | None]]:
    """(index, render minor) of each AMD GPU: the inventory's, else what the machine shows now."""
    if ctx.inventory is not None:
        mine = ctx.inventory.from_source(SOURCE)
        return sorted((gpu.index, gpu.int_attribute("renderMinor")) for gpu in mine if gpu.index is not None)
    return [(g.index, g.render_minor) for g in amd_gpus(ctx.machine)]


def suggested_names(gpus: list[tuple[int, int | None]], render_minors: set[int]) -> list[str]:
    """The GPUs whose render nodes came with the raw /dev/kfd; the only GPU; else `all`."""
    chosen = [cdi_name(index) for index, minor in gpus if minor in render_minors]
    if chosen:
        return chosen
    if len(gpus) == 1:
        return [cdi_name(gpus[0][0])]
    return [cdi_name("all")]


def _refusal(
    raw: str, path: str, gpus: list[tuple[int, int | None]], minors: set[int], ctx: GateContext
) -> Refusal:
    shown = raw if raw == path else f"{raw} (which is {path})"
    message = (
        f"raw device {shown} is refused: a container reaches host devices only through CDI names "
        f"granted to its repo"
    )
    if not gpus:
        message += f"; `rdc machine gpu list {ctx.machine.name}` shows the {KIND} names of this machine"
        return Refusal(message, replacement=f"--device {KIND}=gpu<N>", rule=RULE, subject=raw)
    names = suggested_names(gpus, minors)
    if names == [cdi_name("all")]:
        message += f" (one GPU each: {cdi_name(gpus[0][0])} … {cdi_name(gpus[-1][0])})"
    missing = [n for n in names if n not in ctx.grants]
    if missing:
        message += f"; grant it first: rdc repo gpu grant {ctx.repo_ref} " + " ".join(
            f"--device {n}" for n in missing
        )
    return Refusal(message, replacement=" ".join(f"--device {n}" for n in names), rule=RULE, subject=raw)
