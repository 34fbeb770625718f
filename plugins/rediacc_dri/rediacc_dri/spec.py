"""The `rediacc.io/dri` CDI spec: one device per render node, mapping that node and nothing else."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rediacc_core import CdiSpecFile, Machine, SetupContext, device_node_edit, host_node
from rediacc_dri.discovery import KIND, SOURCE, drm_class_dir, sysfs_dev_numbers

SPEC_FILE = "rediacc-dri.yaml"
CDI_VERSION = "0.5.0"  # the first version with deviceNodes[].hostPath


def spec_document(machine: Machine, minors: Iterable[int]) -> dict[str, Any] | None:
    """The spec for these render minors; None when none of them has a node on the host."""
    devices = []
    for minor in sorted(set(minors)):
        name = f"renderD{minor}"
        node = host_node(machine.path(f"/dev/dri/{name}"), sysfs_dev_numbers(drm_class_dir(machine) / name))
        if node is None:
            continue  # listed in sysfs but absent from /dev: nothing a container could be given
        edit = device_node_edit(f"/dev/dri/{name}", node)
        devices.append({"name": name, "containerEdits": {"deviceNodes": [edit]}})
    if not devices:
        return None
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices}


def render_minors_of(ctx: SetupContext) -> list[int]:
    minors = (gpu.attributes.get("renderMinor") for gpu in ctx.gpus if gpu.source == SOURCE)
    return [m for m in minors if isinstance(m, int)]


def cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    document = spec_document(ctx.machine, render_minors_of(ctx))
    # Owned either way: without render nodes the file is returned empty, so the core removes it.
    return [CdiSpecFile(SPEC_FILE, spec=document)]
