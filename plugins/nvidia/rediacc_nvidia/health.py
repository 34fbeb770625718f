"""NVIDIA GPU health: XIDs from the kernel log, uncorrected ECC errors from NVML where it loads.

The driver writes each XID to the kernel log as `NVRM: Xid (PCI:0000:3b:00): 79, pid=…, GPU has fallen
off the bus.` (drivers before 400 omit `PCI:`); the address has no function number. As NVIDIA's
k8s-device-plugin does, every XID makes the card unhealthy except the application errors 13, 31,
43, 45, 68 and 109, which a program causes and the card survives: those are not reported at all.
ECC errors that reach the kernel log are XIDs too (48: double-bit error, 63/64: row remapping,
94/95: contained/uncontained); NVML adds the volatile uncorrected count on a host where it loads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from rediacc_core import HealthEvent, Inventory, Machine, kernel_log
from rediacc_nvidia.discovery_nvml import load_nvml
from rediacc_nvidia.values import normalise_bus_id

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.[0-7])?\): "
    r"(?P<code>\d+)\b"
)
# nvmlMemoryErrorType_t / nvmlEccCounterType_t values (nvml.h).
_UNCORRECTED = 1
_VOLATILE = 0


def xid_events(lines: list[str]) -> list[HealthEvent]:
    """The XIDs of kernel log lines, application XIDs left out."""
    events = []
    for line in lines:
        found = XID.search(line)
        if found is None or int(found.group("code")) in APPLICATION_XIDS:
            continue
        bus = normalise_bus_id(f"{found.group('bus')}.0")
        if bus is None:
            continue
        events.append(
            HealthEvent(
                pci_bus_id=bus,
                reason=f"xid-{int(found.group('code'))}",
                message=line[found.start() :].strip(),
                key=line.strip(),
            )
        )
    return events


def ecc_events(nvml: Any) -> list[HealthEvent]:
    """A volatile uncorrected ECC count above zero, per GPU NVML sees (nothing where ECC is off)."""
    events = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            count = int(nvml.nvmlDeviceGetTotalEccErrors(handle, _UNCORRECTED, _VOLATILE))
            bus_raw = nvml.nvmlDeviceGetPciInfo(handle).busId
        except Exception:  # ECC not supported or disabled on this card: nothing to report
            continue
        bus = normalise_bus_id(bus_raw.decode() if isinstance(bus_raw, bytes) else str(bus_raw))
        if count > 0 and bus is not None:
            message = f"NVML: {count} uncorrected ECC error(s) since the driver loaded"
            events.append(HealthEvent(pci_bus_id=bus, reason="ecc-uncorrected", message=message, key=message))
    return events


def health(
    machine: Machine, inventory: Inventory, nvml_loader: Callable[[], Any | None] = load_nvml
) -> list[HealthEvent]:
    if not inventory.from_source("nvidia"):
        return []
    ours = {gpu.pci_bus_id for gpu in inventory.from_source("nvidia") if gpu.pci_bus_id}
    events = xid_events(kernel_log(machine))
    if machine.is_host:
        nvml = nvml_loader()
        if nvml is not None:
            events += ecc_events(nvml)
    return [event for event in events if event.pci_bus_id in ours]
