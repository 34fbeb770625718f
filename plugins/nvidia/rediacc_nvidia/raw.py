"""Gate rule: a raw `/dev/nvidia*` device is refused, naming the `nvidia.com/gpu` device to use instead.

`/dev/nvidia<M>` is the GPU whose device minor is M (which need not be its index); the control nodes
(`/dev/nvidiactl`, `/dev/nvidia-uvm*`, `/dev/nvidia-caps/…`) come with every `nvidia.com/gpu` device.
"""

from __future__ import annotations

import re

from rediacc_core import ApiRequest, GateContext, Gpu, Refusal, Verdict, landing_paths
from rediacc_nvidia import names
from rediacc_nvidia.lookup import nvidia_gpus

RULE = "raw-device"  # the core's generic rule: our refusal replaces its message
GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
NVIDIA_NODE = re.compile(r"^/dev/nvidia[^/]*(/|$)")


def request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for raw in request.raw_device_paths():
        landed = [path for path in landing_paths(ctx.machine, raw) if NVIDIA_NODE.match(path)]
        if landed:
            verdicts.append(_refusal(raw, landed[-1], ctx))
    return verdicts


def suggested_name(path: str, gpus: list[Gpu]) -> str | None:
    """The `nvidia.com/gpu` name of the GPU behind `/dev/nvidia<M>`; None for other nodes."""
    match = GPU_NODE.match(path)
    if match is None:
        return None
    minor = int(match.group(1))
    by_minor = [gpu for gpu in gpus if gpu.int_attribute("minor") == minor]
    # Without a recorded minor, the driver numbers nodes in index order.
    chosen = by_minor or [gpu for gpu in gpus if gpu.index == minor and "minor" not in gpu.attributes]
    if chosen and chosen[0].index is not None:
        return names.qualified(str(chosen[0].index))
    return names.qualified(str(minor)) if not gpus else None


def _refusal(raw: str, path: str, ctx: GateContext) -> Refusal:
    shown = raw if raw == path else f"{raw} (which is {path})"
    message = (
        f"raw device {shown} is refused: a container reaches host devices only through CDI names "
        f"granted to its repo"
    )
    name = suggested_name(path, nvidia_gpus(ctx.inventory))
    if name is None:
        message += (
            f"; the driver's nodes come with every {names.KIND} device "
            f"(`rdc machine gpu list {ctx.machine.name}` shows this machine's names)"
        )
        return Refusal(message, replacement=f"--device {names.KIND}=<N>", rule=RULE, subject=raw)
    if name not in ctx.grants:
        message += f"; grant it first: rdc repo gpu grant {ctx.repo_ref} --device {name}"
    return Refusal(message, replacement=f"--device {name}", rule=RULE, subject=raw)
