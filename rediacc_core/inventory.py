"""The machine's GPU inventory: `<root>/etc/rediacc/gpu/inventory.json`.

Written by `rdc machine setup` from what the plugins discovered and from the CDI specs actually on
the machine, so a name listed as grantable is one a repo daemon can really inject. Validated against
`schema/inventory.schema.json` on every read and write; a broken file is an error naming it, never
"no GPUs".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rediacc_core.errors import ValidationError
from rediacc_core.files import (
    LiveFile,
    StatKey,
    atomic_write_json,
    file_schema_errors,
    read_text_keyed,
    schema_errors,
)

if TYPE_CHECKING:
    from rediacc_core.bindings import Reaches
    from rediacc_core.cdi.registry import Registry
    from rediacc_core.machine import Machine
    from rediacc_core.model import Gpu, GpuPartition, Inventory

SCHEMA = "inventory.schema.json"
SCHEMA_VERSION = 1


def now_utc() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_inventory(
    machine: Machine,
    gpus: Iterable[Gpu],
    registry: Registry,
    *,
    now: datetime | None = None,
    unplaced: Mapping[str, str] | None = None,
    specs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The inventory document for `machine`.

    A GPU's CDI names are kept only when a spec on the machine defines them: a plugin may expect a
    name that its tool did not generate (toolkit off, driver too old), and listing it would invite
    a grant that can never work. Names in `unplaced` (a spec defines them, no discovered hardware
    is them) are listed under `ungrantable` with why, not under `devices`. `specs` is the stat
    fingerprint of the spec files the document was built from (`spec_facts.recorded`). Setup then
    records on each device entry what the name reaches (`reaches`, see `setup`).
    """
    defined = registry.names()
    unplaced = unplaced or {}

    def spec_of(name: str) -> str:
        path = registry.devices[name].spec.path
        return path.name if path is not None else ""

    document: dict[str, Any] = {
        "schemaVersion": SCHEMA_VERSION,
        "generatedAt": iso(now or now_utc()),
        "machine": machine.name,
        "platform": machine.platform,
        "gpus": [gpu_record(gpu, defined) for gpu in gpus],
        "devices": [
            {"name": name, "kind": name.split("=", 1)[0], "spec": spec_of(name)}
            for name in sorted(registry.devices)
            if name not in unplaced
        ],
    }
    if unplaced:
        document["ungrantable"] = [
            {"name": name, "kind": name.split("=", 1)[0], "spec": spec_of(name), "why": why}
            for name, why in sorted(unplaced.items())
        ]
    if specs is not None:
        document["specs"] = specs
    return document


def _names(names: Iterable[str], defined: frozenset[str] | None) -> list[str]:
    seen: list[str] = []
    for name in names:
        if (defined is None or name in defined) and name not in seen:
            seen.append(name)
    return seen


def _partition(part: GpuPartition, defined: frozenset[str] | None) -> dict[str, Any]:
    return {
        "index": part.index,
        "uuid": part.uuid,
        "profile": part.profile,
        "memoryMiB": part.memory_mib,
        "cdiNames": _names(part.cdi_names, defined),
        "attributes": dict(part.attributes),
    }


def gpu_record(gpu: Gpu, defined: frozenset[str] | None = None) -> dict[str, Any]:
    """`gpu` as the inventory records it; CDI names kept only when `defined` has them (None: all)."""
    return {
        "vendor": gpu.vendor,
        "source": gpu.source,
        "name": gpu.name,
        "index": gpu.index,
        "pciBusId": gpu.pci_bus_id,
        "driver": gpu.driver,
        "driverVersion": gpu.driver_version,
        "memoryMiB": gpu.memory_mib,
        "cdiNames": _names(gpu.cdi_names, defined),
        "attributes": dict(gpu.attributes),
        "partitions": [_partition(part, defined) for part in gpu.partitions],
    }


def inventory_from_document(document: Mapping[str, Any]) -> Inventory:
    """The typed `Inventory` of a document that passed `check_inventory` (camelCase to fields)."""
    # The typed model is imported here: a listing (`rdc machine gpu list`) reads the document only.
    from rediacc_core.model import CdiDevice, Inventory

    return Inventory(
        machine=document["machine"],
        platform=document["platform"],
        generated_at=document["generatedAt"],
        gpus=tuple(_gpu(record) for record in document["gpus"]),
        devices=tuple(
            CdiDevice(name=device["name"], kind=device["kind"], spec=device["spec"])
            for device in document["devices"]
        ),
    )


def _gpu(record: Mapping[str, Any]) -> Gpu:
    from rediacc_core.model import Gpu, GpuPartition

    return Gpu(
        vendor=record["vendor"],
        source=record["source"],
        name=record["name"],
        index=record["index"],
        pci_bus_id=record["pciBusId"],
        driver=record["driver"],
        driver_version=record["driverVersion"],
        memory_mib=record["memoryMiB"],
        cdi_names=tuple(record["cdiNames"]),
        attributes=dict(record["attributes"]),
        partitions=tuple(
            GpuPartition(
                index=part["index"],
                uuid=part["uuid"],
                profile=part["profile"],
                memory_mib=part["memoryMiB"],
                cdi_names=tuple(part["cdiNames"]),
                attributes=dict(part["attributes"]),
            )
            for part in record["partitions"]
        ),
    )


def check_inventory(document: Any, source: str, *, text: str | None = None, machine: str = "MACHINE") -> None:
    """Raise ValidationError naming `source` when `document` is not a valid inventory. With `text`
    (what the file `source` holds), a text that passed before is not checked again. `machine` is the
    machine whose setup the advice names."""
    if isinstance(document, Mapping) and isinstance(document.get("schemaVersion"), int):
        version = document["schemaVersion"]
        if version > SCHEMA_VERSION:
            raise ValidationError(
                f"inventory {source} has schemaVersion {version}, newer than this rdc understands "
                f"({SCHEMA_VERSION})",
                f"upgrade rdc, or run `rdc machine setup {machine}` again with this version to rewrite it",
            )
    if text is None:
        problems = schema_errors(document, SCHEMA)
    else:
        problems = file_schema_errors(document, text, Path(source), SCHEMA)
    if problems:
        raise ValidationError(
            f"inventory {source} does not match its schema: " + "; ".join(problems[:5]),
            f"run `rdc machine setup {machine}` to regenerate it",
        )


def read_inventory_text(machine: Machine) -> str | None:
    """The inventory file's text exactly as recorded, after validation; None when never set up."""
    path = machine.inventory_path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValidationError(
            f"cannot read inventory {path}: {exc.strerror}", f"check the permissions of {path}"
        ) from exc
    _parse(text, str(path), machine.name)
    return text


def load_inventory(machine: Machine) -> dict[str, Any] | None:
    """The machine's inventory, or None when `rdc machine setup` never ran there."""
    text = read_inventory_text(machine)
    return None if text is None else _parse(text, str(machine.inventory_path), machine.name)


def read_inventory(machine: Machine) -> Inventory | None:
    """The machine's inventory, typed, or None when `rdc machine setup` never ran there."""
    document = load_inventory(machine)
    return None if document is None else inventory_from_document(document)


def _parse(text: str, source: str, machine: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            f"inventory {source} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            f"run `rdc machine setup {machine}` to regenerate it",
        ) from exc
    check_inventory(document, source, text=text, machine=machine)
    result: dict[str, Any] = document
    return result


# The typed inventory, its `specs` rows and what each name reaches (names an older inventory
# records nothing for are absent), as one read of the file gives them.
_Read = tuple["Inventory | None", "list[dict[str, Any]] | None", "Reaches | None"]


def recorded_reaches(document: Mapping[str, Any]) -> Reaches:
    """What each device name of an inventory document reaches, as recorded (see `build_inventory`)."""
    from rediacc_core.bindings import binding_from_json

    return {d["name"]: binding_from_json(d["reaches"]) for d in document["devices"] if "reaches" in d}


class LiveInventory:
    """The machine's inventory as the gate sees it: parsed and typed only when the file changed (one
    `stat` per call otherwise), None when never set up, a ValidationError naming the file when broken."""

    def __init__(self, machine: Machine) -> None:
        path = machine.inventory_path

        def load() -> tuple[StatKey, _Read] | None:
            found = read_text_keyed(path, "inventory")
            if found is None:
                return None
            document = _parse(found[1], str(path), machine.name)
            typed = inventory_from_document(document)
            return found[0], (typed, document.get("specs"), recorded_reaches(document))

        self._file: LiveFile[_Read] = LiveFile(path, load, (None, None, None), "inventory")

    @property
    def reads(self) -> int:
        """How many times the file was parsed (and the typed inventory built)."""
        return self._file.reads

    def get(self) -> Inventory | None:
        return self._file.get()[0]

    def read(self) -> _Read:
        """The inventory, the stat fingerprint of the specs it was built from (None when it records
        none: never set up, or written by an older rdc) and what each name reaches, from one `stat`;
        the same objects until the file changes."""
        return self._file.get()


def write_inventory(machine: Machine, document: Mapping[str, Any]) -> None:
    """Validate, then replace the inventory atomically: a bad document never reaches the disk."""
    check_inventory(document, str(machine.inventory_path), machine=machine.name)
    atomic_write_json(machine.inventory_path, document)


def age(generated_at: str, now: datetime | None = None) -> str:
    """How long ago `generated_at` was, as people say it: `just now`, `3m ago`, `2d ago`."""
    try:
        then = datetime.fromisoformat(generated_at.replace("Z", "+00:00"))
    except ValueError:
        return "unknown"
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = int(((now or now_utc()) - then).total_seconds())
    if seconds < 0:
        return "in the future"
    if seconds < 10:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"
