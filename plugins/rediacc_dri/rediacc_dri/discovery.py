"""Render nodes as the kernel lists them under `/sys/class/drm`, each with the device behind it.

Every render node is reported whatever the vendor: the `rediacc.io/dri` devices map only the node
itself, so they need nothing from the vendor's userspace.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from rediacc_core import Gpu, Machine

KIND = "rediacc.io/dri"
SOURCE = "dri"
RENDER_MAJOR = 226

RENDER_ENTRY = re.compile(r"^renderD(\d+)$")
CARD_ENTRY = re.compile(r"^card(\d+)$")
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# PCI vendor ids of the vendors whose GPUs commonly carry a render node.
VENDORS = {0x8086: "intel", 0x1002: "amd", 0x10DE: "nvidia", 0x1AF4: "virtio"}
LABELS = {"intel": "Intel", "amd": "AMD", "nvidia": "NVIDIA", "virtio": "virtio"}


@dataclass(frozen=True)
class RenderNode:
    """One `/dev/dri/renderD<N>` and what sysfs says about the device that owns it."""

    minor: int
    device_dir: Path | None  # the owning device's sysfs directory, links resolved
    pci_bus_id: str | None
    vendor_id: int | None
    device_id: int | None
    driver: str | None
    product_name: str | None = None
    vram_bytes: int | None = None

    @property
    def name(self) -> str:
        return f"renderD{self.minor}"

    @property
    def cdi_name(self) -> str:
        return f"{KIND}={self.name}"

    @property
    def vendor(self) -> str:
        if self.vendor_id is None:
            return "unknown"
        return VENDORS.get(self.vendor_id, f"0x{self.vendor_id:04x}")


def drm_class_dir(machine: Machine) -> Path:
    return machine.path("/sys/class/drm")


def render_minors(machine: Machine) -> list[int]:
    """The minors of every render node sysfs lists, ascending."""
    try:
        names = os.listdir(drm_class_dir(machine))
    except OSError:
        return []  # no DRM subsystem at all: a machine without GPUs
    return sorted(int(m.group(1)) for m in map(RENDER_ENTRY.match, names) if m)


def render_nodes(machine: Machine) -> list[RenderNode]:
    return [read_render_node(machine, minor) for minor in render_minors(machine)]


def read_render_node(machine: Machine, minor: int) -> RenderNode:
    return _read_node(machine, drm_class_dir(machine) / f"renderD{minor}", minor)


def render_node_of_card(machine: Machine, card: int) -> RenderNode | None:
    """The render node that shares `card<M>`'s device, if the device has exactly one."""
    card_dev = _device_dir(machine, drm_class_dir(machine) / f"card{card}")
    if card_dev is None:
        return None
    same = [n for n in render_nodes(machine) if n.device_dir == card_dev]
    return same[0] if len(same) == 1 else None


def render_nodes_of_pci(machine: Machine, pci_bus_id: str) -> list[RenderNode]:
    return [n for n in render_nodes(machine) if n.pci_bus_id == pci_bus_id.lower()]


def sysfs_dev_numbers(entry: Path) -> tuple[int, int] | None:
    """`major:minor` from a sysfs `dev` file, the kernel's own record of a node's numbers."""
    try:
        major, minor = (_read(entry / "dev") or "").split(":")
        return int(major), int(minor)
    except ValueError:
        return None


def _read_node(machine: Machine, entry: Path, minor: int) -> RenderNode:
    device_dir = _device_dir(machine, entry)
    if device_dir is None:
        return RenderNode(minor, None, None, None, None, None)
    uevent = _uevent(device_dir)
    driver = uevent.get("DRIVER") or _link_name(device_dir / "driver")
    pci = _pci_function(machine, device_dir)
    vendor_id = device_id = None
    pci_bus_id = None
    if pci is not None:
        pci_dir, pci_uevent = pci
        pci_bus_id = (pci_uevent.get("PCI_SLOT_NAME") or pci_dir.name).lower()
        ids = pci_uevent.get("PCI_ID", "").split(":")
        # Some kernels' captures keep only `uevent`; its PCI_ID holds the same two ids.
        vendor_id = _hex(_read(pci_dir / "vendor")) or (_hex(ids[0]) if len(ids) == 2 else None)
        device_id = _hex(_read(pci_dir / "device")) or (_hex(ids[1]) if len(ids) == 2 else None)
    return RenderNode(
        minor=minor,
        device_dir=device_dir,
        pci_bus_id=pci_bus_id,
        vendor_id=vendor_id,
        device_id=device_id,
        driver=driver,
        product_name=_read(device_dir / "product_name") or None,
        vram_bytes=_int(_read(device_dir / "mem_info_vram_total")),
    )


def _device_dir(machine: Machine, entry: Path) -> Path | None:
    link = entry / "device"
    if not link.exists():
        return None
    resolved = Path(os.path.realpath(link))
    root = Path(os.path.realpath(machine.root))
    # A link that leaves the machine root would read another machine's hardware.
    if resolved != root and root not in resolved.parents:
        return None
    return resolved


def _pci_function(machine: Machine, device_dir: Path) -> tuple[Path, dict[str, str]] | None:
    """The PCI function a DRM device sits on: the device itself, or (virtio-gpu) its parent.

    Only one level up: further ancestors are buses (a USB controller, say), not the GPU.
    """
    stop = Path(os.path.realpath(machine.path("/sys")))
    for candidate in (device_dir, device_dir.parent):
        if candidate == stop or stop not in candidate.parents:
            return None
        uevent = _uevent(candidate)
        if "PCI_SLOT_NAME" in uevent or BDF.match(candidate.name):
            return candidate, uevent
    return None


def _uevent(device_dir: Path) -> dict[str, str]:
    text = _read(device_dir / "uevent") or ""
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _link_name(link: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None


def _hex(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _int(text: str | None) -> int | None:
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _driver_version(machine: Machine, driver: str | None) -> str | None:
    # Out-of-tree (DKMS) drivers publish a version; in-tree ones follow the kernel and have none.
    if not driver:
        return None
    return _read(machine.path(f"/sys/module/{driver}/version")) or None


def gpu_of(machine: Machine, node: RenderNode) -> Gpu:
    ids = ""
    if node.vendor_id is not None and node.device_id is not None:
        ids = f" {node.vendor_id:04x}:{node.device_id:04x}"
    label = LABELS.get(node.vendor, node.vendor)
    name = node.product_name or f"{label} GPU{ids}"
    if node.vendor_id is None:
        name = f"render node of {node.driver or 'an unknown driver'}"
    attributes: dict[str, str | int | None] = {"renderMinor": node.minor}
    if node.vendor_id is not None:
        attributes["pciVendorId"] = f"0x{node.vendor_id:04x}"
    if node.device_id is not None:
        attributes["pciDeviceId"] = f"0x{node.device_id:04x}"
    return Gpu(
        vendor=node.vendor,
        source=SOURCE,
        name=name,
        pci_bus_id=node.pci_bus_id,
        driver=node.driver,
        driver_version=_driver_version(machine, node.driver),
        memory_mib=node.vram_bytes // (1024 * 1024) if node.vram_bytes else None,
        cdi_names=(node.cdi_name,),
        attributes=attributes,
    )


def discover(machine: Machine) -> list[Gpu]:
    return [gpu_of(machine, node) for node in render_nodes(machine)]
