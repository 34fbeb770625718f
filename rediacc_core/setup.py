"""`rdc machine setup` and `rdc machine refresh`: discovery, the plugins' setup steps, CDI specs,
then the inventory.

The order protects what is recorded: every spec is produced and validated in a staging directory
before any is written, and the inventory is written last from the specs really on the machine. A
tool that fails or produces an invalid spec stops setup with the tool's own message, and the
previous specs and inventory stay as they were. A refresh is the same path without the plugins'
steps and spec generation: it validates the specs already on the machine (a vendor's refresh
unit may have rewritten them) and rebuilds the inventory from a new discovery.
Both record which defined names no discovered hardware is (`spec_facts`), the specs' identity and
what each name reaches. Last, under the same lock and in the same function (`_record_facts`, the
only writer of the inventory), every repo's grants are checked against the new facts
(`recheck.recheck_grants`): a grant whose name moved to other hardware, vanished or overlaps another
repo's exclusive reservation is suspended. A dry run of either says what that check would change.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rediacc_core.cdi.registry import Registry
from rediacc_core.cdi.spec import dump_spec, parse_spec_text, validate_spec
from rediacc_core.errors import RdcError, ToolError, ValidationError
from rediacc_core.files import atomic_write_text
from rediacc_core.grants.units import HardwareUnits
from rediacc_core.inventory import build_inventory, inventory_from_document, load_inventory, write_inventory
from rediacc_core.machine import Machine
from rediacc_core.model import CdiSpecFile, Gpu, SetupContext
from rediacc_core.plugins import Plugins
from rediacc_core.recheck import GrantChange, change_text, recheck_grants
from rediacc_core.spec_facts import lost_facts, recorded, unplaced_names
from rediacc_core.statelock import state_lock

# Only these suffixes are read by the CDI loader, so a spec under any other name would be lost.
_SPEC_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.(yaml|json)$")
OUTPUT_PLACEHOLDER = "{output}"


class Progress(Protocol):
    """Told when each step starts and ends, so a terminal can show a step list and a spinner."""

    def start(self, title: str, slow: bool = False) -> None: ...

    def finish(self, ok: bool) -> None: ...


class _Silent:
    def start(self, title: str, slow: bool = False) -> None:
        pass

    def finish(self, ok: bool) -> None:
        pass


@dataclass(frozen=True)
class PlannedStep:
    """One step as a dry run prints it."""

    title: str
    lines: tuple[str, ...]


@dataclass
class SetupReport:
    """What setup did (or, on a dry run, would do)."""

    machine: Machine
    dry_run: bool
    gpus: list[Gpu] = field(default_factory=list)
    plan: list[PlannedStep] = field(default_factory=list)
    refusal: RdcError | None = None  # on a dry run: the error the real run would stop with
    written: list[Path] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    inventory: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    grant_changes: list[GrantChange] = field(default_factory=list)  # what the re-check of the grants did
    refresh: bool = False
    previous: dict[str, Any] | None = None  # the inventory before this run, when there was one

    @property
    def cards(self) -> int:
        """Physical GPUs: one card several plugins report (same PCI bus id) counts once."""
        return count_cards(self.gpus)


def count_cards(gpus: Sequence[Gpu]) -> int:
    buses = {gpu.pci_bus_id.lower() for gpu in gpus if gpu.pci_bus_id}
    return len(buses) + sum(1 for gpu in gpus if not gpu.pci_bus_id)


@dataclass(frozen=True)
class _Produced:
    """A spec ready to write: its final place and its exact text."""

    path: Path
    text: str


def _again(machine: Machine) -> str:
    return (
        f"fix the problem above, then run `rdc machine setup {machine.name}` again; "
        "the previous CDI specs and inventory were kept"
    )


@contextmanager
def _step(progress: Progress, title: str, slow: bool = False) -> Iterator[None]:
    progress.start(title, slow)
    try:
        yield
    except BaseException:
        progress.finish(False)
        raise
    progress.finish(True)


def run_setup(
    machine: Machine,
    plugins: Plugins,
    options: Mapping[str, Any],
    *,
    dry_run: bool = False,
    progress: Progress | None = None,
    refresh: bool = False,
) -> SetupReport:
    """Set `machine` up; with `dry_run`, only plan (discovery reads, nothing is changed). With
    `refresh`, install and generate nothing: check the specs on the machine, rebuild the inventory."""
    progress = progress or _Silent()
    report = SetupReport(machine, dry_run, refresh=refresh)

    with _step(progress, "Discover GPUs"):
        report.gpus = plugins.discover(machine)
    report.plan.append(PlannedStep("Discover GPUs", _described_cards(report.gpus) or ("none found",)))
    if refresh:
        return _refresh(machine, plugins, report, progress)

    ctx = SetupContext(machine, tuple(report.gpus), dict(options), dry_run)
    for step in plugins.setup_steps(ctx):
        report.plan.append(PlannedStep(step.title, step.plan))
        if step.refusal is not None:
            if not dry_run:
                raise step.refusal
            report.refusal = report.refusal or step.refusal
            continue
        if not dry_run and step.apply is not None:
            with _step(progress, step.title, step.slow):
                step.apply()

    # Asked only after the steps ran: a step may have installed the tool a spec is generated with.
    spec_files = plugins.cdi_specs(ctx)
    _check_filenames(spec_files)
    report.plan.extend(_plan_specs(machine, spec_files))
    inventory_line = (
        f"write {machine.inventory_path} ({report.cards} GPU(s), grantable names from {machine.cdi_dir})"
    )
    report.plan.append(PlannedStep("Write the inventory", (inventory_line,)))
    if dry_run:
        if report.refusal is not None:
            return report  # the specs come after the step that refuses: the real run never gets there
        for spec_file in spec_files:
            if spec_file.spec is not None:
                _validated_text(spec_file.spec, machine.cdi_dir / spec_file.filename, machine)
        # Against the specs on the machine now: setup regenerates them, but a swap moves no index.
        _planned_recheck(machine, plugins, report, Registry.for_machine(machine))
        return report

    with _step(progress, "Generate and check CDI specs"):
        produced = _produce(machine, spec_files)
    # Under the machine's state lock, so a grant being checked sees the old names or the new ones,
    # never a mix.
    with state_lock(machine):
        report.previous = _previous(machine, report)
        _write(machine, plugins, report, spec_files, produced, progress)
    return report


def _write(
    machine: Machine,
    plugins: Plugins,
    report: SetupReport,
    spec_files: list[CdiSpecFile],
    produced: list[_Produced],
    progress: Progress,
) -> None:
    with _step(progress, "Write CDI specs"):
        for item in produced:
            atomic_write_text(item.path, item.text)
            report.written.append(item.path)
        for spec_file in spec_files:
            if spec_file.spec is None and spec_file.command is None:
                target = machine.cdi_dir / spec_file.filename
                if target.exists() or target.is_symlink():
                    target.unlink()
                    report.removed.append(target)
    _record_facts(machine, plugins, report, Registry.for_machine(machine), progress)


def _record_facts(
    machine: Machine, plugins: Plugins, report: SetupReport, registry: Registry, progress: Progress
) -> None:
    """Write the inventory from this discovery and the specs on the machine now, then check every
    grant against it, under the state lock the caller holds: the one way new facts are recorded
    (setup and refresh), so no grant is left bound to hardware its name no longer reaches."""
    with _step(progress, "Write the inventory"):
        report.inventory = _inventory_document(machine, plugins, report, registry)
        report.warnings.extend(lost_facts(report.previous, report.inventory))
        write_inventory(machine, report.inventory)
    # Every grant against the new facts, before anyone can use a grant whose name moved.
    with _step(progress, "Check the grants"):
        report.grant_changes = recheck_grants(machine, plugins, locked=True)


def _inventory_document(
    machine: Machine, plugins: Plugins, report: SetupReport, registry: Registry
) -> dict[str, Any]:
    """The inventory of this discovery and `registry`'s specs: names no discovered hardware is are
    recorded as not grantable, the specs' identity, and what each name reaches (`reaches`, which the
    gate and the runtime guard compare a grant's recorded hardware with)."""
    report.warnings.extend(registry.errors)
    report.warnings.extend(registry.conflict_messages())
    specs = recorded(registry.loaded_fingerprint, machine)
    placed = build_inventory(machine, report.gpus, registry, specs=specs)
    unplaced = unplaced_names(registry, inventory_from_document(placed), plugins)
    document = build_inventory(machine, report.gpus, registry, unplaced=unplaced, specs=specs)
    units = HardwareUnits(machine, plugins, inventory=inventory_from_document(document))
    for device in document["devices"]:
        device["reaches"] = [unit.to_json() for unit in units.binding(device["name"])]
    return document


def _planned_recheck(machine: Machine, plugins: Plugins, report: SetupReport, registry: Registry) -> None:
    """A dry run's "Check the grants" step: what the re-check would change on this discovery's facts."""
    document = _inventory_document(machine, plugins, report, registry)
    report.grant_changes = recheck_grants(
        machine, plugins, inventory=inventory_from_document(document), dry_run=True
    )
    lines = [f"{change.what}: grant {change_text(change)}" for change in report.grant_changes]
    report.plan.append(
        PlannedStep(
            "Check the grants",
            (
                f"check every repo's grants in {machine.grants_path} against the new inventory "
                "(a grant whose name moved, vanished or overlaps an exclusive one is suspended)",
                *(lines or ["no grant would change"]),
            ),
        )
    )


def _refresh(machine: Machine, plugins: Plugins, report: SetupReport, progress: Progress) -> SetupReport:
    """Check every spec under etc/cdi as setup checks what it generates, then rebuild the inventory.
    A spec that fails stops the refresh with the previous inventory kept."""
    registry = Registry.for_machine(machine)
    files = sorted({spec.path.name for spec in registry.specs if spec.path is not None})
    report.plan.append(
        PlannedStep(
            f"Check the CDI specs in {machine.cdi_dir}",
            (f"read and check {', '.join(files)}",) if files else ("no spec files",),
        )
    )
    report.plan.append(
        PlannedStep(
            "Write the inventory",
            (
                f"write {machine.inventory_path} ({report.cards} GPU(s), grantable names from "
                f"{machine.cdi_dir}; nothing is installed or generated)",
            ),
        )
    )
    broken = registry.errors + registry.conflict_messages()
    refusal = None
    if broken:
        refusal = ToolError(
            "CDI specs on the machine cannot be used: " + "; ".join(broken),
            f"fix or remove them, or run `rdc machine setup {machine.name}` to generate rdc's again; "
            "the previous inventory was kept",
        )
    if report.dry_run:
        report.refusal = refusal
        if refusal is None:
            _planned_recheck(machine, plugins, report, registry)
        return report
    if refusal is not None:
        raise refusal
    with state_lock(machine):
        report.previous = _previous(machine, report)
        # Read again under the lock: a setup may have rewritten them meanwhile.
        registry = Registry.for_machine(machine)
        _record_facts(machine, plugins, report, registry, progress)
    return report


def _previous(machine: Machine, report: SetupReport) -> dict[str, Any] | None:
    try:
        return load_inventory(machine)
    except RdcError as exc:  # a broken inventory is replaced; it has no facts to compare with
        report.warnings.append(f"the previous inventory was unreadable and is replaced: {exc.what}")
        return None


def _described_cards(gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """One line per card, as `gpu list` shows them: a card several plugins report (same PCI bus id)
    is described by the fullest report, naming every plugin that found it."""
    cards: dict[str, list[Gpu]] = {}
    for gpu in gpus:
        cards.setdefault(gpu.pci_bus_id.lower() if gpu.pci_bus_id else f"#{len(cards)}", []).append(gpu)
    lines = []
    for same in cards.values():
        lead = max(same, key=lambda g: sum(bool(v) for v in dataclasses.astuple(g)))
        parts = [f"{lead.vendor} {lead.name}".strip()]
        if lead.pci_bus_id:
            parts.append(f"at {lead.pci_bus_id}")
        parts.append(f"(found by {', '.join(dict.fromkeys(g.source for g in [lead, *same]))})")
        lines.append(" ".join(parts))
    return tuple(lines)


def _check_filenames(spec_files: list[CdiSpecFile]) -> None:
    seen: set[str] = set()
    for spec_file in spec_files:
        if not _SPEC_FILENAME.match(spec_file.filename):
            raise RdcError(
                f"a plugin asked for the CDI spec file name {spec_file.filename!r}, which is not a plain "
                "*.yaml or *.json file name",
                "report this to the plugin's authors; `rdc plugins` lists the plugins",
            )
        if spec_file.filename in seen:
            raise RdcError(
                f"two plugins claim the CDI spec file {spec_file.filename!r}",
                "uninstall one of them or limit loading with REDIACC_LOAD_PLUGINS; `rdc plugins` lists them",
            )
        if spec_file.spec is not None and spec_file.command is not None:
            raise RdcError(
                f"a plugin gave both a document and a command for {spec_file.filename!r}",
                "report this to the plugin's authors",
            )
        seen.add(spec_file.filename)


def _plan_specs(machine: Machine, spec_files: list[CdiSpecFile]) -> list[PlannedStep]:
    planned = []
    for spec_file in spec_files:
        target = machine.cdi_dir / spec_file.filename
        lines: tuple[str, ...]
        if spec_file.command is not None:
            argv = [arg.replace(OUTPUT_PLACEHOLDER, str(target)) for arg in spec_file.command]
            lines = (f"run: {shlex.join(argv)}", f"check, then write {target}")
        elif spec_file.spec is not None:
            lines = (f"write {target} ({', '.join(_spec_names(spec_file.spec)) or 'no devices'})",)
        elif target.exists() or target.is_symlink():
            lines = (f"remove {target} (nothing to describe any more)",)
        else:
            lines = (f"nothing to write ({target} stays absent)",)
        planned.append(PlannedStep(f"CDI spec {spec_file.filename}", lines))
    return planned


def _spec_names(document: Mapping[str, Any]) -> list[str]:
    kind = document.get("kind", "?")
    devices = document.get("devices") or []
    return [f"{kind}={dev.get('name')}" for dev in devices if isinstance(dev, Mapping)]


def _produce(machine: Machine, spec_files: list[CdiSpecFile]) -> list[_Produced]:
    """Every spec's final text, each validated; raises before anything under etc/cdi changes."""
    # Documents first: they need no tool and no disk, so a bad one stops setup before anything runs.
    documents = {
        s.filename: _validated_text(s.spec, machine.cdi_dir / s.filename, machine)
        for s in spec_files
        if s.spec is not None
    }
    generated: dict[str, str] = {}
    commands = [s for s in spec_files if s.command is not None]
    if commands:
        # Beside etc/cdi, never inside it: the repo daemons read every file there, half-made ones too.
        parent = machine.cdi_dir.parent
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".rdc-setup-", dir=parent))
        try:
            for spec_file in commands:
                target = machine.cdi_dir / spec_file.filename
                generated[spec_file.filename] = _run_generator(machine, spec_file, staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    texts = {**documents, **generated}
    return [
        _Produced(machine.cdi_dir / s.filename, texts[s.filename]) for s in spec_files if s.filename in texts
    ]


def _run_generator(machine: Machine, spec_file: CdiSpecFile, staging: Path, target: Path) -> str:
    """Run the plugin's generator into `staging`; its output text once parsed and validated."""
    assert spec_file.command is not None
    staged = staging / spec_file.filename
    argv = [arg.replace(OUTPUT_PLACEHOLDER, str(staged)) for arg in spec_file.command]
    # Messages show the command as the plan does, with the final path: the staging dir is gone by then.
    shown = shlex.join(arg.replace(OUTPUT_PLACEHOLDER, str(target)) for arg in spec_file.command)
    result = machine.run(argv, env=dict(spec_file.env))
    if not result.ok:
        message = (result.stderr.strip() or result.stdout.strip() or "(no output)").replace(
            str(staged), str(target)
        )
        raise ToolError(f"`{shown}` failed with exit code {result.returncode}:\n{message}", _again(machine))
    try:
        text = staged.read_text(encoding="utf-8")
    except OSError as exc:
        raise ToolError(
            f"`{shown}` succeeded but wrote no spec where it was asked to ({exc.strerror})", _again(machine)
        ) from exc
    source = f"{target} (as generated by `{argv[0]}`)"
    try:
        document = parse_spec_text(text, staged.suffix.lstrip("."), source)
    except ValidationError as exc:
        raise ToolError(f"`{shown}` wrote an unreadable CDI spec: {exc.what}", _again(machine)) from exc
    _validate(document, source, machine)
    return text


def _validate(document: Any, source: str, machine: Machine) -> None:
    try:
        validate_spec(document, source)
    except ValidationError as exc:
        raise ToolError(f"invalid CDI spec: {exc.what}", _again(machine)) from exc


def _validated_text(document: Mapping[str, Any], target: Path, machine: Machine) -> str:
    _validate(document, str(target), machine)
    return dump_spec(document, target)
