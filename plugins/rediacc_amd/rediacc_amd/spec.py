"""The `rediacc.io/amd` CDI spec: `gpu<N>` per GPU or partition (`/dev/kfd` + its render node), and `all`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rediacc_amd.discovery import KFD_NODE, KIND, SOURCE
from rediacc_core import CdiSpecFile, Machine, SetupContext, device_node_edit, host_node, sysfs_dev_numbers

SPEC_FILE = "rediacc-amd.yaml"
CDI_VERSION = "0.5.0"  # the first version with deviceNodes[].hostPath


def spec_document(machine: Machine, gpus: Sequence[tuple[int, int]]) -> dict[str, Any] | None:
    """The spec for `(index, render minor)` pairs; None when there is nothing a container could use."""
    kfd = host_node(machine.path(KFD_NODE), sysfs_dev_numbers(machine.path("/sys/class/kfd/kfd/dev")))
    if kfd is None:
        return None
    kfd_edit = device_node_edit(KFD_NODE, kfd)
    devices: list[dict[str, Any]] = []
    renders: list[dict[str, str | int]] = []
    for index, minor in sorted(gpus):
        name = f"renderD{minor}"
        render = host_node(
            machine.path(f"/dev/dri/{name}"), sysfs_dev_numbers(machine.path(f"/sys/class/drm/{name}/dev"))
        )
        if render is None:
            continue  # its render node is gone: /dev/kfd alone reaches no card
        edit = device_node_edit(f"/dev/dri/{name}", render)
        if edit not in renders:
            renders.append(edit)
        devices.append({"name": f"gpu{index}", "containerEdits": {"deviceNodes": [kfd_edit, edit]}})
    if not devices:
        return None
    devices.append({"name": "all", "containerEdits": {"deviceNodes": [kfd_edit, *renders]}})
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices}


def cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    pairs = []
    for gpu in ctx.gpus:
        minor = gpu.attributes.get("renderMinor")
        if gpu.source == SOURCE and gpu.index is not None and isinstance(minor, int):
            pairs.append((gpu.index, minor))
    # Owned either way: without AMD GPUs the file is returned empty, so the core removes it.
    return [CdiSpecFile(SPEC_FILE, spec=spec_document(ctx.machine, pairs))]
