"""The CDI names the NVIDIA Container Toolkit gives GPUs, and how this plugin forms them.

`nvidia-ctk cdi generate` names every GPU twice (by index and by UUID), every MIG device twice
(`<gpu>:<mig>` and its `MIG-` UUID) and adds `all`. The inventory keeps only the names the generated
spec really defines, so forming a name here is a promise checked later, never a guess that sticks.
"""

from __future__ import annotations

import re

VENDOR = "nvidia.com"
KIND = "nvidia.com/gpu"
PREFIX = f"{KIND}="
ALL = f"{PREFIX}all"

# The CDI device-name grammar: a legacy `MIG-GPU-<uuid>/<gi>/<ci>` id contains `/` and is no name.
_DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


def is_device_name(text: str) -> bool:
    return _DEVICE_NAME.match(text) is not None


def qualified(device: str) -> str:
    return f"{PREFIX}{device}"


def device_part(name: str) -> str | None:
    """`0` from `nvidia.com/gpu=0`; None for names of other kinds."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else None


def gpu_names(index: int | None, uuid: str | None) -> tuple[str, ...]:
    names = []
    if index is not None:
        names.append(qualified(str(index)))
    if uuid and is_device_name(uuid):
        names.append(qualified(uuid))
    return tuple(names)


def mig_names(gpu_index: int | None, mig_index: int, uuid: str | None) -> tuple[str, ...]:
    names = []
    if gpu_index is not None:
        names.append(qualified(f"{gpu_index}:{mig_index}"))
    if uuid and is_device_name(uuid):
        names.append(qualified(uuid))
    return tuple(names)
