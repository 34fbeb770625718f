"""`NVIDIA_VISIBLE_DEVICES` and the MIG variables: every form the runtime read, mapped to CDI names.

Under runc nothing reads these variables any more, so a container that sets them gets no GPU (or,
on a daemon still carrying the old runtime, bypasses the grants). The gate turns them into the CDI
names they meant. Forms, comma separated: GPU indices (`0`), `GPU-<uuid>`, `MIG-<uuid>`, the legacy
`MIG-GPU-<uuid>/<gpu instance>/<compute instance>`, `<gpu>:<mig>`, PCI bus ids (`0000:01:00.0`,
also nvidia-smi's 8-digit-domain spelling), and `all`. `none` asks for the driver but no GPU; `void`,
empty or unset means "not a GPU container".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from rediacc_core import Gpu
from rediacc_nvidia import names
from rediacc_nvidia.lookup import gpu_uuid, resolve
from rediacc_nvidia.values import is_bus_id, normalise_bus_id

VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES")

TokenKind = Literal["all", "index", "gpu-uuid", "mig-uuid", "mig-legacy", "mig-index", "pci"]

_HEX_UUID = r"[0-9A-Fa-f]+(?:-[0-9A-Fa-f]+)*"
_FORMS: tuple[tuple[TokenKind, re.Pattern[str]], ...] = (
    ("index", re.compile(r"^\d+$")),
    ("mig-index", re.compile(r"^\d+:\d+$")),
    ("gpu-uuid", re.compile(rf"^GPU-{_HEX_UUID}$")),
    ("mig-legacy", re.compile(rf"^MIG-GPU-({_HEX_UUID})/(\d+)/(\d+)$")),
    ("mig-uuid", re.compile(rf"^MIG-{_HEX_UUID}$")),
)


class VisibleDevicesError(ValueError):
    """A value that names no device form, or a device this machine does not have."""


@dataclass(frozen=True)
class VisibleRequest:
    variable: str
    value: str
    state: Literal["void", "none", "devices"]
    tokens: tuple[str, ...] = ()


def token_kind(token: str) -> TokenKind | None:
    if token == "all":
        return "all"
    for kind, pattern in _FORMS:
        if pattern.match(token):
            return kind
    return "pci" if is_bus_id(token) else None


def parse_visible(variable: str, value: str) -> VisibleRequest:
    """Read `value` as the toolkit does: empty entries are skipped, `void` anywhere (or nothing at
    all) means no GPU container, and otherwise the first `all` or `none` decides the whole list."""
    tokens = tuple(token.strip() for token in value.split(",") if token.strip())
    if not tokens or "void" in tokens:
        return VisibleRequest(variable, value, "void")
    special = next((token for token in tokens if token in ("all", "none")), None)
    if special == "none":
        return VisibleRequest(variable, value, "none")
    if special == "all":
        return VisibleRequest(variable, value, "devices", ("all",))
    for token in tokens:
        if token_kind(token) is None:
            raise VisibleDevicesError(
                f"{variable}={value!r}: {token!r} is not a GPU index, GPU-/MIG- UUID, <gpu>:<mig> pair, "
                "PCI bus id, all, none or void"
            )
    return VisibleRequest(variable, value, "devices", tokens)


def legacy_requests(env: Mapping[str, str]) -> list[VisibleRequest]:
    """The legacy variables set in `env`, parsed (raises VisibleDevicesError for a malformed one)."""
    return [parse_visible(name, env[name]) for name in VARIABLES if name in env]


def _known(gpus: list[Gpu]) -> str:
    listed = [
        name for gpu in gpus for name in (*gpu.cdi_names, *(n for p in gpu.partitions for n in p.cdi_names))
    ]
    return ", ".join(listed) if listed else "none (run `rdc machine setup` on the machine)"


def _name_for(token: str, gpus: list[Gpu], variable: str) -> str:
    kind = token_kind(token)
    missing = VisibleDevicesError(
        f"{variable} names {token!r}, which is no GPU on this machine; its NVIDIA devices are: {_known(gpus)}"
    )
    if kind == "all":
        return names.ALL
    if kind == "index":
        if gpus and not any(gpu.index == int(token) for gpu in gpus):
            raise missing
        return names.qualified(str(int(token)))
    if kind == "mig-index":
        gpu_index, mig_index = (int(part) for part in token.split(":"))
        if gpus and not any(
            gpu.index == gpu_index and any(p.index == mig_index for p in gpu.partitions) for gpu in gpus
        ):
            raise missing
        return names.qualified(f"{gpu_index}:{mig_index}")
    if kind == "gpu-uuid":
        if not gpus:
            return names.qualified(token)
        for gpu in gpus:
            uuid = gpu_uuid(gpu)
            if uuid and uuid.lower() == token.lower():
                return names.qualified(uuid)
        raise missing
    if kind == "mig-uuid":
        if not gpus:
            return names.qualified(token)
        for gpu in gpus:
            for part in gpu.partitions:
                if part.uuid and part.uuid.lower() == token.lower():
                    return names.qualified(part.uuid)
        raise missing
    if not gpus:
        raise VisibleDevicesError(
            f"{variable} names {token!r}, which only the machine's inventory can match, and there is "
            "none; run `rdc machine setup` on the machine"
        )
    if kind == "mig-legacy":
        match = _FORMS[3][1].match(token)
        assert match is not None
        uuid, gi, ci = "GPU-" + match.group(1), int(match.group(2)), int(match.group(3))
        for gpu in gpus:
            if (gpu_uuid(gpu) or "").lower() != uuid.lower():
                continue
            for part in gpu.partitions:
                if (
                    part.int_attribute("gpuInstanceId") == gi
                    and part.int_attribute("computeInstanceId") == ci
                ):
                    return names.qualified(f"{gpu.index}:{part.index}")
        raise missing
    bus = normalise_bus_id(token)
    for gpu in gpus:
        if gpu.pci_bus_id and gpu.pci_bus_id.lower() == bus and gpu.index is not None:
            return names.qualified(str(gpu.index))
    raise missing


def cdi_names(request: VisibleRequest, gpus: list[Gpu]) -> list[str]:
    """The CDI names a legacy request meant, in its order, one per device (`0,GPU-<its uuid>` is one)."""
    if request.state != "devices":
        return []
    result: list[str] = []
    seen: set[object] = set()
    for token in request.tokens:
        name = _name_for(token, gpus, request.variable)
        if name == names.ALL:
            return [names.ALL]
        found = resolve(name, gpus)
        identity: object = (found[0].index, found[1].index if found[1] else None) if found else name
        if identity not in seen:
            seen.add(identity)
            result.append(name)
    return result
