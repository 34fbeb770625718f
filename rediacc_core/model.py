"""The dataclasses that flow between the core and its plugins.

Hooks return these, never bare dicts, so a plugin author's editor can tell them what a field means
and `mypy` can tell them when they got it wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rediacc_core.cdi.names import is_qualified_name

if TYPE_CHECKING:
    from rediacc_core.errors import RdcError
    from rediacc_core.machine import Machine

Scalar = str | int | float | bool | None


# --- discovery -------------------------------------------------------------------------------


class _Attributed:
    """Typed reads of a plugin's `attributes`: a value of another type reads as None, never raises."""

    attributes: Mapping[str, Scalar]

    def int_attribute(self, key: str) -> int | None:
        value = self.attributes.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def str_attribute(self, key: str) -> str | None:
        value = self.attributes.get(key)
        return value if isinstance(value, str) else None


@dataclass(frozen=True, kw_only=True)
class GpuPartition(_Attributed):
    """A slice of a GPU that can be handed out on its own (a partition or MIG-style instance)."""

    index: int
    uuid: str | None = None
    profile: str | None = None
    memory_mib: int | None = None
    cdi_names: tuple[str, ...] = ()
    attributes: Mapping[str, Scalar] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Gpu(_Attributed):
    """One GPU as a plugin discovered it.

    `vendor` is the hardware vendor, lower case, as the plugin names it; `source` is the plugin that
    found it. Several plugins may report the same card (a generic render-node plugin and the
    card vendor's own): `pci_bus_id` ties them together. `cdi_names` are the qualified names the
    plugin expects to address this GPU; the inventory keeps only those a spec on the machine defines.
    """

    vendor: str
    source: str
    name: str
    index: int | None = None
    pci_bus_id: str | None = None
    driver: str | None = None
    driver_version: str | None = None
    memory_mib: int | None = None
    cdi_names: tuple[str, ...] = ()
    attributes: Mapping[str, Scalar] = field(default_factory=dict)
    partitions: tuple[GpuPartition, ...] = ()

    def partition(self, index: int) -> GpuPartition | None:
        """The partition numbered `index` on this GPU, if it has one."""
        return next((part for part in self.partitions if part.index == index), None)


@dataclass(frozen=True, kw_only=True)
class CdiDevice:
    """A CDI device a spec on the machine defines: `name` is qualified (`kind=device`)."""

    name: str
    kind: str
    spec: str  # the spec file's name under <root>/etc/cdi


@dataclass(frozen=True, kw_only=True)
class Inventory:
    """A machine's inventory as hooks get it: what `rdc machine setup` recorded, typed.

    The core builds it once from `inventory.json` each time that file changes, so lookups are cheap
    enough for the gate's request path. `gpus` hold only CDI names a spec on the machine defined
    when setup ran; `devices` are every name defined then, with its kind and spec file.
    """

    machine: str = ""
    platform: str = "native"
    generated_at: str = ""
    gpus: tuple[Gpu, ...] = ()
    devices: tuple[CdiDevice, ...] = ()
    _holders: Mapping[str, tuple[Gpu, GpuPartition | None]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        holders: dict[str, tuple[Gpu, GpuPartition | None]] = {}
        for gpu in self.gpus:
            for name in gpu.cdi_names:
                holders.setdefault(name, (gpu, None))
            for part in gpu.partitions:
                for name in part.cdi_names:
                    holders.setdefault(name, (gpu, part))
        object.__setattr__(self, "_holders", holders)

    def from_source(self, source: str) -> tuple[Gpu, ...]:
        """The GPUs the plugin `source` discovered, in the inventory's order."""
        return tuple(gpu for gpu in self.gpus if gpu.source == source)

    def holder(self, cdi_name: str) -> tuple[Gpu, GpuPartition | None] | None:
        """The GPU listing `cdi_name` (first in order), and its partition when the name is a slice's."""
        return self._holders.get(cdi_name)

    def with_attribute(self, key: str, value: Scalar) -> tuple[Gpu, ...]:
        """The GPUs whose `attributes[key]` is `value` (e.g. every GPU on one render node)."""
        return tuple(gpu for gpu in self.gpus if _same(gpu.attributes.get(key, _MISSING), value))

    def names_of_kind(self, kind: str) -> tuple[str, ...]:
        """The defined CDI names of one vendor kind (`vendor.example/gpu`), in the inventory's order."""
        return tuple(device.name for device in self.devices if device.kind == kind)


_MISSING = object()


def _same(found: object, value: Scalar) -> bool:
    # JSON keeps true and 1 apart; Python's == does not.
    return found == value and isinstance(found, bool) == isinstance(value, bool)


# --- health ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HealthEvent:
    """One event a GPU's driver reported (a kernel log line, a management library's counter).

    `pci_bus_id` names the card as `Gpu.pci_bus_id` does (lower case, with domain); `reason` is short
    and stable (`xid-79`, `ecc-dbe`, `reset`), for the metrics and `gpu list`; `message` is what the
    driver said. A `fatal` event holds the card back until an operator clears it; others are shown
    only. `key` tells this event from a later one of the same reason (the log line with its
    timestamp): the core records each (card, key) once, so a cleared event seen again stays cleared.
    """

    pci_bus_id: str
    reason: str
    message: str
    fatal: bool = True
    key: str = ""

    @property
    def identity(self) -> str:
        return self.key or self.message


# --- setup -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SetupContext:
    """What setup hooks get: the machine, the discovered GPUs and the plugin options' values."""

    machine: Machine
    gpus: tuple[Gpu, ...]
    options: Mapping[str, Any]
    dry_run: bool = False


@dataclass(frozen=True)
class SetupStep:
    """One step of `rdc machine setup`.

    `plan` lines are what a dry run prints (each command, each file); `apply` does the work and is
    never called on a dry run. Steps run in ascending `order`, then in plugin order. A step that
    already knows it cannot succeed (a missing tool it may not install) gives the error as `refusal`:
    the real run raises it instead of calling `apply`, and a dry run, after printing the plan, exits
    with it too, so `--dry-run` answers as the real run would.
    """

    title: str
    plan: tuple[str, ...]
    apply: Callable[[], None] | None = None
    order: int = 50
    slow: bool = False  # e.g. a package install: the CLI shows a spinner
    refusal: RdcError | None = None


@dataclass(frozen=True)
class CdiSpecFile:
    """A CDI spec file a plugin owns, under `<root>/etc/cdi/<filename>`.

    Exactly one way to produce it: `spec` (the document itself), or `command` (argv that writes it;
    the literal `{output}` in an argument is replaced by a staging path). Neither means: the plugin
    owns this file and there is nothing to describe now, so the core removes it.
    """

    filename: str
    spec: Mapping[str, Any] | None = None
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)


# --- the gate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiRequest:
    """A Docker API request as the daemon will read it.

    `path` is URL-decoded with the `/v1.xx` prefix removed; `body` is the canonical decoded JSON
    (object keys spelled as the daemon's Go structs spell them) or None. `cdi_devices` are the
    qualified CDI names the request asks for, after the core has folded Compose's legacy
    `HostConfig.Devices` form into the CDI device request.
    """

    method: str
    path: str
    query: Mapping[str, tuple[str, ...]]
    body: Any = None
    api_version: str | None = None
    cdi_devices: tuple[str, ...] = ()

    @property
    def is_container_create(self) -> bool:
        return self.method == "POST" and self.path == "/containers/create"

    @property
    def is_container_update(self) -> bool:
        return (
            self.method == "POST" and self.path.startswith("/containers/") and self.path.endswith("/update")
        )

    def raw_device_paths(self) -> list[str]:
        """`PathOnHost` of every raw device entry (create or update); CDI names are not raw paths.

        Compose's legacy form puts CDI names there; the core moves those into `cdi_devices`.
        """
        if not isinstance(self.body, Mapping):
            return []
        holder: Any = self.body.get("HostConfig") if self.is_container_create else self.body
        if not (self.is_container_create or self.is_container_update) or not isinstance(holder, Mapping):
            return []
        devices = holder.get("Devices")
        paths: list[str] = []
        for entry in devices if isinstance(devices, list) else []:
            path = entry.get("PathOnHost") if isinstance(entry, Mapping) else None
            if isinstance(path, str) and path and not is_qualified_name(path):
                paths.append(path)
        return paths


@dataclass(frozen=True)
class Refusal:
    """Why a request may not pass, and what to use instead.

    `rule` is a short, stable id (the audit trail and the metrics count refusals by it); `subject`
    is the value the refusal is about, spelled as the request has it (a device path, a driver, a
    runtime). A plugin refusal replaces the core's refusal with the same `(rule, subject)`; one
    with a core rule's id and no subject replaces every core refusal of that rule.
    """

    message: str
    replacement: str | None = None
    status: Literal[400, 403] = 403
    rule: str = ""
    subject: str = ""


@dataclass(frozen=True)
class Rewrite:
    """A change to a container-create request that makes it the CDI form.

    Data only, applied by the core, so every rewrite is visible in the gate's log and every CDI name
    it adds is checked against the repo's grants like any other.
    """

    description: str
    add_cdi_devices: tuple[str, ...] = ()
    remove_env: tuple[str, ...] = ()


Verdict = Refusal | Rewrite


@dataclass(frozen=True)
class GateContext:
    """What request rules may consult. Everything here is current for each decision (files are
    re-read, and the inventory rebuilt, only when they changed)."""

    repo_name: str
    repo_ref: str  # e.g. "alpha@m1", for messages that show the grant command
    machine: Machine
    grants: frozenset[str]
    inventory: Inventory | None  # None: `rdc machine setup` never ran, or its file is unreadable
    settings: Mapping[str, Any]
    image_config: Callable[[str], Mapping[str, Any] | None]
    log: Callable[[str], None]
    # Why this repo could not be granted a CDI name now (another repo holds it, or hardware it
    # reaches, exclusively: who, and the handover command), or None: for advice that leads somewhere.
    in_the_way: Callable[[str], str | None] = lambda name: None
