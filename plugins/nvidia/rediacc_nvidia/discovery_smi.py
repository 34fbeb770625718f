"""Reading `nvidia-smi`: the `-q -x` XML report, `--query-gpu` CSV and the `-L` list.

No single output has everything. The XML has the GPUs in index order with minor numbers, PCI bus ids,
memory and MIG devices (with their memory); only `--query-gpu=compute_cap` has the compute
capability (drivers from about 510 on); only `-L` has MIG profiles and MIG UUIDs. `combine` merges
them into the plugin's `Gpu` records. Elements come and go between driver versions (418 has no
`mig_mode`), so every field is optional and parsing never depends on indentation.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rediacc_core import Gpu, GpuPartition
from rediacc_nvidia import names
from rediacc_nvidia.values import int_or_none, mib_or_none, normalise_bus_id, text_or_none

# Fields this plugin asks `--query-gpu` for; compute_cap is what the XML lacks, the rest match rows.
QUERY_FIELDS = ("index", "uuid", "pci.bus_id", "compute_cap")


class SmiParseError(ValueError):
    """nvidia-smi printed something this parser cannot read; the message says what and where."""


@dataclass(frozen=True)
class XmlMig:
    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_mib: int | None


@dataclass(frozen=True)
class XmlGpu:
    index: int
    name: str
    brand: str | None
    architecture: str | None
    uuid: str | None
    minor: int | None
    pci_bus_id: str | None
    memory_mib: int | None
    mig_mode: str | None
    migs: tuple[XmlMig, ...] = ()


@dataclass(frozen=True)
class XmlReport:
    driver_version: str | None
    cuda_version: str | None
    gpus: tuple[XmlGpu, ...]


@dataclass(frozen=True)
class ListedMig:
    index: int
    profile: str | None
    uuid: str


@dataclass(frozen=True)
class ListedGpu:
    index: int
    name: str
    uuid: str | None
    migs: tuple[ListedMig, ...] = field(default=())


# --- nvidia-smi -q -x ---------------------------------------------------------------------------


def _text(element: ET.Element | None, path: str) -> str | None:
    if element is None:
        return None
    found = element.find(path)
    return text_or_none(found.text) if found is not None else None


def _mig_mode(gpu: ET.Element) -> str | None:
    current = _text(gpu, "mig_mode/current_mig")
    return current if current in ("Enabled", "Disabled") else None


def _mig(position: int, mig: ET.Element) -> XmlMig:
    index = int_or_none(_text(mig, "index"))
    return XmlMig(
        index=index if index is not None else position,
        gpu_instance_id=int_or_none(_text(mig, "gpu_instance_id")),
        compute_instance_id=int_or_none(_text(mig, "compute_instance_id")),
        memory_mib=mib_or_none(_text(mig, "fb_memory_usage/total")),
    )


def parse_xml(text: str) -> XmlReport:
    """The GPUs of an `nvidia-smi -q -x` report, in the order nvidia-smi numbers them."""
    try:
        root = ET.fromstring(text.lstrip("\ufeff \t\r\n"))
    except ET.ParseError as exc:
        raise SmiParseError(f"nvidia-smi -q -x printed XML that does not parse ({exc})") from exc
    if root.tag != "nvidia_smi_log":
        raise SmiParseError(f"nvidia-smi -q -x printed <{root.tag}>, expected <nvidia_smi_log>")
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        migs = tuple(
            _mig(position, mig) for position, mig in enumerate(gpu.findall("mig_devices/mig_device"))
        )
        gpus.append(
            XmlGpu(
                index=index,
                name=_text(gpu, "product_name") or "NVIDIA GPU",
                brand=_text(gpu, "product_brand"),
                architecture=_text(gpu, "product_architecture"),
                uuid=_text(gpu, "uuid"),
                minor=int_or_none(_text(gpu, "minor_number")),
                pci_bus_id=normalise_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id")),
                memory_mib=mib_or_none(_text(gpu, "fb_memory_usage/total")),
                mig_mode=_mig_mode(gpu),
                migs=migs,
            )
        )
    return XmlReport(
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        gpus=tuple(gpus),
    )


# --- nvidia-smi --query-gpu=... --format=csv ------------------------------------------------------


def _field_name(header: str) -> str:
    """`memory.total [MiB]` -> `memory.total`: the header repeats the unit even with nounits."""
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", header.strip())


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> list[dict[str, str | None]]:
    """Rows of `--query-gpu` CSV as {field: value}, `[N/A]` as None, units left on the values.

    With a header row the field names come from it; `fields` names the columns of headerless output
    (`--format=csv,noheader`).
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    rows = list(reader)
    if fields is None:
        header = [_field_name(cell) for cell in rows[0]]
        rows = rows[1:]
    else:
        header = list(fields)
    parsed = []
    for number, row in enumerate(rows, start=1):
        if len(row) != len(header):
            raise SmiParseError(
                f"nvidia-smi --query-gpu row {number} has {len(row)} values for {len(header)} fields"
            )
        parsed.append({name: text_or_none(value) for name, value in zip(header, row, strict=True)})
    return parsed


# --- nvidia-smi -L ----------------------------------------------------------------------------------

_LIST_GPU = re.compile(r"^\s*GPU\s+(\d+):\s*(.*?)\s*\(UUID:\s*([^)]*?)\s*\)\s*$")
# `MIG 3g.40gb Device 0: (UUID: MIG-...)` since R470; R450 printed `MIG Device 0:` with no profile.
_LIST_MIG = re.compile(r"^\s*MIG\s+(?:(?!Device\b)(\S+)\s+)?Device\s+(\d+):\s*\(UUID:\s*([^)]*?)\s*\)\s*$")


def parse_list(text: str) -> list[ListedGpu]:
    """GPUs and their MIG devices from `nvidia-smi -L`."""
    gpus: list[ListedGpu] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        gpu = _LIST_GPU.match(line)
        if gpu is not None:
            gpus.append(ListedGpu(int(gpu.group(1)), gpu.group(2), text_or_none(gpu.group(3))))
            continue
        mig = _LIST_MIG.match(line)
        if mig is not None and gpus:
            parent = gpus[-1]
            entry = ListedMig(int(mig.group(2)), mig.group(1), mig.group(3))
            gpus[-1] = ListedGpu(parent.index, parent.name, parent.uuid, (*parent.migs, entry))
            continue
        raise SmiParseError(
            f"nvidia-smi -L line {number} is neither a GPU nor a MIG device: {line.strip()!r}"
        )
    return gpus


# --- putting them together --------------------------------------------------------------------------


def _query_row_for(gpu: XmlGpu, rows: Sequence[Mapping[str, str | None]]) -> Mapping[str, str | None]:
    for row in rows:
        if gpu.pci_bus_id and normalise_bus_id(row.get("pci.bus_id")) == gpu.pci_bus_id:
            return row
    for row in rows:
        if gpu.uuid and row.get("uuid") == gpu.uuid:
            return row
    for row in rows:
        if int_or_none(row.get("index")) == gpu.index:
            return row
    return {}


def _listed_for(gpu: XmlGpu, listed: Sequence[ListedGpu]) -> ListedGpu | None:
    # Index first: masked captures give several GPUs one UUID, but never one index.
    for entry in listed:
        if entry.index == gpu.index:
            return entry
    return None


def _partitions(gpu: XmlGpu, listed: ListedGpu | None) -> tuple[GpuPartition, ...]:
    by_index = {mig.index: mig for mig in gpu.migs}
    listed_by_index = {mig.index: mig for mig in (listed.migs if listed else ())}
    partitions = []
    for mig_index in sorted(set(by_index) | set(listed_by_index)):
        xml_mig = by_index.get(mig_index)
        listed_mig = listed_by_index.get(mig_index)
        uuid = listed_mig.uuid if listed_mig else None
        attributes: dict[str, str | int | None] = {}
        if xml_mig is not None:
            attributes["gpuInstanceId"] = xml_mig.gpu_instance_id
            attributes["computeInstanceId"] = xml_mig.compute_instance_id
        partitions.append(
            GpuPartition(
                index=mig_index,
                uuid=uuid,
                profile=listed_mig.profile if listed_mig else None,
                memory_mib=xml_mig.memory_mib if xml_mig else None,
                cdi_names=names.mig_names(gpu.index, mig_index, uuid),
                attributes=attributes,
            )
        )
    return tuple(partitions)


def combine(
    report: XmlReport,
    query_rows: Sequence[Mapping[str, str | None]],
    listed: Sequence[ListedGpu],
    platform: str,
) -> list[Gpu]:
    """One `Gpu` per GPU of the XML report, completed from `--query-gpu` rows and `-L`."""
    gpus = []
    for xml_gpu in report.gpus:
        row = _query_row_for(xml_gpu, query_rows)
        entry = _listed_for(xml_gpu, listed)
        uuid = xml_gpu.uuid or (entry.uuid if entry else None)
        gpus.append(
            Gpu(
                vendor="nvidia",
                source="nvidia",
                name=xml_gpu.name,
                index=xml_gpu.index,
                pci_bus_id=xml_gpu.pci_bus_id,
                driver="nvidia",
                driver_version=report.driver_version,
                memory_mib=xml_gpu.memory_mib,
                cdi_names=names.gpu_names(xml_gpu.index, uuid),
                attributes={
                    "uuid": uuid,
                    "minor": xml_gpu.minor,
                    "cudaDriverVersion": report.cuda_version,
                    "computeCapability": text_or_none(row.get("compute_cap")),
                    "brand": xml_gpu.brand,
                    "architecture": xml_gpu.architecture,
                    "migMode": xml_gpu.mig_mode,
                    "platform": platform,
                },
                partitions=_partitions(xml_gpu, entry),
            )
        )
    return gpus
