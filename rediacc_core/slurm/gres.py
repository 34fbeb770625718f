"""The node's `gres.conf` and, beside it, the map from Slurm's GPU index to the hardware and the
CDI name rdc grants: both from the inventory and the CDI specs, written together, one generation.

Slurm numbers a node's GPUs in the order gres.conf lists them and hands the prolog those numbers
(`SLURM_JOB_GPUS`); the map (`/etc/rediacc/slurm/gres-map.json`) says which card each number is.
Every GPU is listed with explicit `File=` (`AutoDetect=off`: Debian's Slurm has no NVML plugin),
a partition (a MIG slice) with `MultipleFiles=` (its parent's node and its own). A map that no
longer matches what the inventory and the specs say now is stale: every lease is refused until
`rdc slurm gres` runs again (fail closed), since a number could name another card.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rediacc_core.cdi.registry import Registry
from rediacc_core.errors import StateError
from rediacc_core.files import atomic_write_json, atomic_write_text, parse_json_checked
from rediacc_core.inventory import read_inventory
from rediacc_core.machine import Machine
from rediacc_core.model import Gpu, GpuPartition, Inventory
from rediacc_core.repos import now_iso
from rediacc_core.slurm.node import MAP_PATH as MAP_PATH  # where it always was, for callers

SCHEMA = "slurm-gres-map.schema.json"
SCHEMA_VERSION = 1
DEFAULT_CONF = "/etc/slurm/gres.conf"


@dataclass(frozen=True)
class GresEntry:
    """One GPU (or slice) as Slurm counts it: its index, type, files and what rdc grants for it."""

    index: int
    type: str
    cdi: str
    files: tuple[str, ...]
    uuid: str | None = None
    pci_bus_id: str | None = None
    cores: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "type": self.type,
            "cdi": self.cdi,
            "files": list(self.files),
            "uuid": self.uuid,
            "pciBusId": self.pci_bus_id,
            "cores": self.cores,
        }

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> GresEntry:
        return cls(
            entry["index"],
            entry["type"],
            entry["cdi"],
            tuple(entry["files"]),
            entry["uuid"],
            entry["pciBusId"],
            entry["cores"],
        )

    def same_hardware(self, other: GresEntry) -> bool:
        return (self.type, self.cdi, self.files, self.uuid, self.pci_bus_id) == (
            other.type,
            other.cdi,
            other.files,
            other.uuid,
            other.pci_bus_id,
        )


@dataclass(frozen=True)
class GresMap:
    node: str
    generation: str
    generated_at: str
    conf: str  # the gres.conf path written with it, as the machine sees it
    entries: tuple[GresEntry, ...]
    features: tuple[str, ...] = ()

    def by_index(self, index: int) -> GresEntry | None:
        return next((e for e in self.entries if e.index == index), None)


# --- what the inventory says -------------------------------------------------------------------


def gres_type(gpu: Gpu) -> str:
    """The Slurm type of a GPU: a plugin's `gresType` attribute, else the first word of its model
    name made of letters and digits both (`H100` of `… H100 80GB HBM3`, `A100` of `A100-SXM4-40GB`,
    `MI210`), lower case; else the vendor's name."""
    given = gpu.str_attribute("gresType")
    if given:
        return _slurm_word(given)
    words = [w for w in re.split(r"[\s_/()-]+", gpu.name) if w and w.lower() != gpu.vendor.lower()]
    model = next((w for w in words if re.search(r"[A-Za-z]", w) and re.search(r"[0-9]", w)), gpu.vendor)
    return _slurm_word(model)


def _slurm_word(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "", text.lower()) or "gpu"


def _host_files(machine: Machine, registry: Registry, name: str) -> tuple[str, ...]:
    """The device nodes the CDI device `name` has of its own (not the spec's shared ones), as host paths."""
    entry = registry.get(name)
    if entry is None:
        return ()
    own = entry.spec.device(entry.name).get("containerEdits", {}).get("deviceNodes", [])
    files = []
    for node in own:
        host = node.get("hostPath") or node["path"]
        files.append(host if node.get("hostPath") or machine.is_host else str(machine.path(host)))
    return tuple(files)


def _cores(machine: Machine, pci_bus_id: str | None) -> str | None:
    """The CPUs of the GPU's NUMA node (sysfs), when the kernel knows it."""
    if not pci_bus_id:
        return None
    try:
        numa = int(machine.path(f"/sys/bus/pci/devices/{pci_bus_id.lower()}/numa_node").read_text().strip())
        if numa < 0:
            return None
        return machine.path(f"/sys/devices/system/node/node{numa}/cpulist").read_text().strip() or None
    except (OSError, ValueError):
        return None


def _cards(inventory: Inventory) -> list[Gpu]:
    """One record per card: several plugins may report one card (tied by its PCI bus id); the
    first that names it with a CDI name and a UUID wins, else the first with a CDI name."""
    chosen: dict[str, Gpu] = {}
    for gpu in inventory.gpus:
        if not gpu.cdi_names and not any(p.cdi_names for p in gpu.partitions):
            continue
        key = gpu.pci_bus_id or f"{gpu.source}:{gpu.index}:{gpu.name}"
        held = chosen.get(key)
        if held is None or (held.str_attribute("uuid") is None and gpu.str_attribute("uuid") is not None):
            chosen[key] = gpu
    return list(chosen.values())


def current_entries(machine: Machine, inventory: Inventory, registry: Registry) -> list[GresEntry]:
    """Every GPU (every slice, for a partitioned one) the machine would list now, in gres order."""
    rows: list[tuple[str, Gpu, GpuPartition | None, str, tuple[str, ...]]] = []
    for gpu in _cards(inventory):
        kind = gres_type(gpu)
        units: list[tuple[GpuPartition | None, tuple[str, ...], str]] = (
            [
                (part, part.cdi_names, f"{kind}_{_slurm_word(part.profile or str(part.index))}")
                for part in gpu.partitions
            ]
            if gpu.partitions
            else [(None, gpu.cdi_names, kind)]
        )
        for part, names, typed in units:
            name = next((n for n in names if registry.get(n) is not None), None)
            files = _host_files(machine, registry, name) if name else ()
            if name and files:
                rows.append((typed, gpu, part, name, files))
    entries = []
    for index, (typed, gpu, part, name, files) in enumerate(rows):
        uuid = (part.uuid if part is not None else None) or gpu.str_attribute("uuid")
        cores = _cores(machine, gpu.pci_bus_id)
        entries.append(GresEntry(index, typed, name, files, uuid, gpu.pci_bus_id, cores))
    return entries


def features(inventory: Inventory) -> list[str]:
    """Node features for `--constraint`: each card's architecture, memory (`80gb`) and driver major."""
    found: dict[str, None] = {}
    for gpu in _cards(inventory):
        arch = gpu.str_attribute("architecture")
        if arch:
            found[_slurm_word(arch)] = None
        if gpu.memory_mib:
            found[f"{round(gpu.memory_mib / 1024)}gb"] = None
        if gpu.driver_version:
            found[f"driver{gpu.driver_version.split('.')[0]}"] = None
    return list(found)


# --- the files ---------------------------------------------------------------------------------


def conf_text(node: str, entries: Sequence[GresEntry], generation: str = "") -> str:
    lines = [
        "# Written by `rdc slurm gres`; rewritten by setup and refresh. Do not edit: the index map",
        f"# beside it ({MAP_PATH}) must list the same GPUs in the same order.",
        *([f"# rdc-generation: {generation}"] if generation else []),
        "AutoDetect=off",
    ]
    for e in entries:
        files = f"File={e.files[0]}" if len(e.files) == 1 else f"MultipleFiles={','.join(e.files)}"
        cores = f" Cores={e.cores}" if e.cores else ""
        lines.append(f"NodeName={node} Name=gpu Type={e.type} {files}{cores}")
    return "\n".join(lines) + "\n"


def node_line(node: str, entries: Sequence[GresEntry], node_features: Sequence[str]) -> str:
    """The `slurm.conf` line's GPU part for this node: `Gres=gpu:h100:2 Features=hopper,80gb`."""
    counts: dict[str, int] = {}
    for e in entries:
        counts[e.type] = counts.get(e.type, 0) + 1
    gres = ",".join(f"gpu:{kind}:{n}" for kind, n in counts.items())
    line = f"NodeName={node} Gres={gres}" if gres else f"NodeName={node}"
    return line + (f" Features={','.join(node_features)}" if node_features else "")


def _generation(node: str, entries: Sequence[GresEntry]) -> str:
    return hashlib.sha256(conf_text(node, entries).encode()).hexdigest()[:16]


def build(machine: Machine, node: str, conf: str = DEFAULT_CONF) -> GresMap:
    """The map the machine's inventory and specs give now (nothing written)."""
    inventory = read_inventory(machine)
    if inventory is None:
        raise StateError(
            f"machine {machine.name} has no inventory", f"run `rdc machine setup {machine.name}` first"
        )
    entries = current_entries(machine, inventory, Registry.for_machine(machine))
    return GresMap(
        node, _generation(node, entries), now_iso(), conf, tuple(entries), tuple(features(inventory))
    )


def write(machine: Machine, node: str, conf: str = DEFAULT_CONF) -> GresMap:
    """Write the node's gres.conf and the map of the same generation (the map last: a reader that
    finds the new map finds the new gres.conf)."""
    built = build(machine, node, conf)
    atomic_write_text(machine.path(conf), conf_text(node, built.entries, built.generation))
    atomic_write_json(machine.path(MAP_PATH), map_json(built))
    return built


def map_json(found: GresMap) -> dict[str, Any]:
    return {
        "schemaVersion": SCHEMA_VERSION,
        "node": found.node,
        "generation": found.generation,
        "generatedAt": found.generated_at,
        "conf": found.conf,
        "features": list(found.features),
        "gpus": [e.to_json() for e in found.entries],
    }


def read_map(machine: Machine) -> GresMap | None:
    path = machine.path(MAP_PATH)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    document = parse_json_checked(text, path, SCHEMA, "gres map")
    return GresMap(
        document["node"],
        document["generation"],
        document["generatedAt"],
        document["conf"],
        tuple(GresEntry.from_json(e) for e in document["gpus"]),
        tuple(document["features"]),
    )


def stale_reason(machine: Machine, found: GresMap | None) -> str | None:
    """Why the map cannot be trusted now (None when it can): missing, its gres.conf of another
    generation, or hardware that no longer matches what the inventory and the specs say."""
    fix = f"run `rdc slurm gres {machine.name} --node {found.node if found else 'NODE'}`"
    if found is None:
        return f"no gres map at {MAP_PATH}: {fix}"
    try:
        text = machine.path(found.conf).read_text(encoding="utf-8")
    except OSError:
        return f"{found.conf} is missing: {fix}"
    if f"# rdc-generation: {found.generation}\n" not in text:
        return f"{found.conf} is not the generation of the gres map ({found.generation}): {fix}"
    if text != conf_text(found.node, found.entries, found.generation):
        return f"{found.conf} was changed since rdc wrote it: {fix}"
    now = build(machine, found.node, found.conf)
    if len(now.entries) != len(found.entries) or not all(
        a.same_hardware(b) for a, b in zip(now.entries, found.entries, strict=True)
    ):
        return f"the GPUs of machine {machine.name} changed since the gres map was written: {fix}"
    return None


def map_path(machine: Machine) -> Path:
    return machine.path(MAP_PATH)
