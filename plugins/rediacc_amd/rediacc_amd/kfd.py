"""AMD GPUs as the KFD (the kernel's compute interface) lists them in its topology.

`/sys/class/kfd/kfd/topology/nodes/<n>/` holds one node per CPU socket and one per GPU, or one per
GPU partition when a card runs in a partitioned compute mode (e.g. CPX on MI300-class cards): each
partition is then a node of its own with its own render node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TOPOLOGY = "/sys/class/kfd/kfd/topology"

# HSA heap types of a memory bank that are the card's own memory (public and private frame buffer).
VRAM_HEAPS = frozenset({1, 2})

# Product names by PCI device id, for the cards whose topology we have seen; others get a generic name.
PRODUCTS = {
    0x6860: "Radeon Instinct MI25",
    0x740F: "Instinct MI210",
    0x74A1: "Instinct MI300X",
    0x74A2: "Instinct MI308X",
}

# What some kernels write into `name` instead of a product name.
PLACEHOLDER_NAMES = frozenset({"", "ip discovery"})


@dataclass(frozen=True)
class MemBank:
    heap_type: int
    size_in_bytes: int


@dataclass(frozen=True)
class KfdNode:
    """One topology node, as read."""

    node: int
    gpu_id: int | None  # absent from some captures; 0 on CPU nodes
    name: str
    properties: Mapping[str, int]
    mem_banks: tuple[MemBank, ...] = ()

    @property
    def is_gpu(self) -> bool:
        if self.gpu_id == 0:
            return False
        return self.properties.get("simd_count", 0) > 0

    @property
    def location_id(self) -> int:
        return self.properties.get("location_id", 0)

    @property
    def domain(self) -> int:
        return self.properties.get("domain", 0)

    @property
    def render_minor(self) -> int:
        return self.properties.get("drm_render_minor", 0)


@dataclass(frozen=True)
class AmdGpu:
    """A GPU (or one partition of one) ready to be published as `rediacc.io/amd=gpu<index>`."""

    index: int
    node: int
    gpu_id: int | None
    render_minor: int
    pci_bus_id: str  # the card's PCI function, the same for every partition of a card
    partition: int | None  # None when the card is not partitioned
    device_id: int | None
    gfx_target: str | None
    name: str
    memory_mib: int | None
    unique_id: int | None


def read_properties(text: str) -> dict[str, int]:
    """`key value` lines; values are integers (some are unsigned 64-bit). Other lines are skipped."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                found[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return found


def read_node(node_dir: Path) -> KfdNode:
    properties = read_properties(_read(node_dir / "properties") or "")
    gpu_id_text = _read(node_dir / "gpu_id")
    banks = []
    for bank_dir in _numbered(node_dir / "mem_banks"):
        bank = read_properties(_read(bank_dir / "properties") or "")
        if "heap_type" in bank and "size_in_bytes" in bank:
            banks.append(MemBank(bank["heap_type"], bank["size_in_bytes"]))
    return KfdNode(
        node=int(node_dir.name),
        gpu_id=int(gpu_id_text) if gpu_id_text and gpu_id_text.isdigit() else None,
        name=(_read(node_dir / "name") or "").strip(),
        properties=properties,
        mem_banks=tuple(banks),
    )


def read_topology(topology_dir: Path) -> list[KfdNode]:
    """Every node under `<topology_dir>/nodes`, in node order; [] when there is no topology."""
    return [read_node(d) for d in _numbered(topology_dir / "nodes")]


def pci_address(domain: int, location_id: int) -> str:
    """`location_id` is the PCI bus/device/function packed as the kernel's `pci_dev_id`."""
    bus, dev, fn = location_id >> 8, (location_id >> 3) & 0x1F, location_id & 0x7
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def gfx_target(version: int | None) -> str | None:
    """`gfx_target_version` (major*10000 + minor*100 + stepping) as the LLVM target name."""
    if not version:
        return None
    major, minor, step = version // 10000, (version // 100) % 100, version % 100
    return f"gfx{major}{minor:x}{step:x}"


def gpus_from_nodes(nodes: Sequence[KfdNode]) -> list[AmdGpu]:
    """GPU nodes as numbered GPUs: by PCI address, then partition.

    The kernel reports a partition's node with the partition number folded into the function bits
    of `location_id`, so partitions of one card share domain, bus and device (and `unique_id`, when
    the kernel exposes it). The card's own address is the lowest one among them.
    """
    usable = [n for n in nodes if n.is_gpu and n.render_minor > 0]
    cards: dict[tuple[int, int, int | None], list[KfdNode]] = {}
    for node in usable:
        key = (node.domain, node.location_id >> 3, node.properties.get("unique_id") or None)
        cards.setdefault(key, []).append(node)
    ordered: list[tuple[tuple[int, int, int], KfdNode, int, int | None]] = []
    for members in cards.values():
        base = min(m.location_id for m in members)
        for member in members:
            partition = member.location_id - base if len(members) > 1 else None
            ordered.append(((member.domain, base, partition or 0), member, base, partition))
    ordered.sort(key=lambda item: (item[0], item[1].render_minor))
    return [
        _amd_gpu(index, node, pci_address(node.domain, base), partition)
        for index, (_, node, base, partition) in enumerate(ordered)
    ]


def _amd_gpu(index: int, node: KfdNode, pci_bus_id: str, partition: int | None) -> AmdGpu:
    props = node.properties
    device_id = props.get("device_id") or None
    target = gfx_target(props.get("gfx_target_version"))
    product = PRODUCTS.get(device_id or 0)
    if product:
        name = f"AMD {product}"
    elif node.name.lower() not in PLACEHOLDER_NAMES:
        name = f"AMD GPU {node.name}"
    else:
        name = f"AMD GPU {target or (f'0x{device_id:04x}' if device_id else 'unknown')}"
    if partition is not None:
        name += f" (partition {partition})"
    vram = sum(b.size_in_bytes for b in node.mem_banks if b.heap_type in VRAM_HEAPS)
    vram = vram or props.get("local_mem_size", 0)  # older kernels: no banks, but the total
    return AmdGpu(
        index=index,
        node=node.node,
        gpu_id=node.gpu_id,
        render_minor=node.render_minor,
        pci_bus_id=pci_bus_id,
        partition=partition,
        device_id=device_id,
        gfx_target=target,
        name=name,
        memory_mib=vram // (1024 * 1024) if vram else None,
        unique_id=props.get("unique_id") or None,
    )


def _numbered(directory: Path) -> list[Path]:
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [directory / n for n in sorted((n for n in names if re.fullmatch(r"\d+", n)), key=int)]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return None
