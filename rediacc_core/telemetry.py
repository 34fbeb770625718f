"""Which repo holds which GPU, for the platform's telemetry: dcgm-exporter's job mapping and a
Prometheus series, rewritten at every change to the grants in force.

- dcgm-exporter (`--hpc-job-mapping-dir DIR`) labels a GPU's metrics with the job ids in the file
  `DIR/<gpu index>` (a MIG device: `DIR/<gpu index>.<gpu instance id>`), one id per line. With the
  machine's `dcgm-job-mapping-dir` setting set, rdc writes there one file per GPU a grant in force
  reaches, naming the repos granted it (a repo's name is its job id) and, for a grant made for a
  Slurm job, that job's id as Slurm numbers it, and removes the files of GPUs
  no grant reaches any more (only files named as a GPU index: other files in DIR are left alone).
- `<root>/run/rediacc/metrics/gpus.prom` (node_exporter's textfile collector, beside the gates'
  files): `rediacc_gpu_grant_info{repo,device,uuid,exclusive} 1` for each grant in force.

`export` is called by whoever changes the grants (every write of the grants file: grant, revoke,
renew, handover, prune) and by each repo gate's housekeeping round, which notices a lease's end
(a lease ends without a write). Both files are written only when their text changes. Export is best
effort: a grant is never undone because telemetry could not be written; the problem is returned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from rediacc_core.errors import RdcError
from rediacc_core.files import atomic_write_text
from rediacc_core.inventory import read_inventory
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.settings import effective, read_settings
from rediacc_core.telemetry_settings import DCGM_JOB_MAPPING_DIR

if TYPE_CHECKING:
    from rediacc_core.model import Gpu, GpuPartition, Inventory

# Imported by the grants, which every read imports: the typed model only where export runs.
METRICS_FILE = "gpus.prom"
_MAPPING_NAME = re.compile(r"^\d+(\.\d+)?$")


class GrantLike(Protocol):
    """What telemetry reads of a grant (`grants.records.Grant`), so this module needs not import grants."""

    @property
    def repo_id(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def exclusive(self) -> bool: ...
    @property
    def job(self) -> str | None: ...


def metrics_path(machine: Machine) -> Path:
    return machine.run_dir / "metrics" / METRICS_FILE


def reached(name: str, inventory: Inventory) -> tuple[list[Gpu], list[tuple[Gpu, GpuPartition]]]:
    """The whole GPUs and the partitions a CDI name reaches: those listing it, else for a kind's
    `all` (which no single GPU lists) every GPU with a name of that kind."""
    gpus = [gpu for gpu in inventory.gpus if name in gpu.cdi_names]
    parts = [(gpu, part) for gpu in inventory.gpus for part in gpu.partitions if name in part.cdi_names]
    kind, _, device = name.partition("=")
    if not gpus and not parts and device == "all":
        gpus = [gpu for gpu in inventory.gpus if any(n.startswith(f"{kind}=") for n in gpu.cdi_names)]
    return gpus, parts


def mapping_files(name: str, inventory: Inventory) -> list[str]:
    """The dcgm-exporter mapping files a CDI name reaches: `<index>` for a whole GPU, `<index>.<gpu
    instance>` for a MIG device (its `gpuInstanceId`, else its index)."""
    gpus, parts = reached(name, inventory)
    files = [str(gpu.index) for gpu in gpus if gpu.index is not None]
    for gpu, part in parts:
        if gpu.index is not None:
            instance = part.int_attribute("gpuInstanceId")
            files.append(f"{gpu.index}.{instance if instance is not None else part.index}")
    return list(dict.fromkeys(files))


def uuid_of(name: str, inventory: Inventory) -> str:
    """The UUID of the one GPU or MIG device a name reaches ("" for a name reaching several)."""
    gpus, parts = reached(name, inventory)
    if len(gpus) + len(parts) != 1:
        return ""
    return (parts[0][1].uuid if parts else gpus[0].str_attribute("uuid")) or ""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def grant_info_text(grants: Iterable[GrantLike], repo_names: dict[str, str], inventory: Inventory) -> str:
    out = [
        "# HELP rediacc_gpu_grant_info A CDI device granted to a repo now (1 per grant in force).",
        "# TYPE rediacc_gpu_grant_info gauge",
    ]
    for g in sorted(grants, key=lambda g: (repo_names.get(g.repo_id, g.repo_id), g.device)):
        repo = repo_names.get(g.repo_id, g.repo_id)
        out.append(
            f'rediacc_gpu_grant_info{{repo="{_label(repo)}",device="{_label(g.device)}",'
            f'uuid="{_label(uuid_of(g.device, inventory))}",exclusive="{str(g.exclusive).lower()}"}} 1'
        )
    return "\n".join(out) + "\n"


def job_mapping(
    grants: Iterable[GrantLike], repo_names: dict[str, str], inventory: Inventory
) -> dict[str, str]:
    """File name -> text, as dcgm-exporter reads them: the repos granted each GPU, one per line, and
    for a grant a Slurm job holds, that job's id as Slurm numbers it (`42` of `slurm:<cluster>/42`)."""
    jobs: dict[str, set[str]] = {}
    for g in grants:
        for file in mapping_files(g.device, inventory):
            jobs.setdefault(file, set()).add(repo_names.get(g.repo_id, g.repo_id))
            if g.job is not None:
                jobs[file].add(g.job.rsplit("/", 1)[-1])
    return {file: "".join(f"{job}\n" for job in sorted(names)) for file, names in jobs.items()}


def _write_if_changed(path: Path, text: str) -> None:
    try:
        if path.read_text(encoding="utf-8") == text:
            return
    except OSError:
        pass
    atomic_write_text(path, text)


def write_job_mapping(directory: Path, files: dict[str, str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        _write_if_changed(directory / name, text)
    for stale in directory.iterdir():
        if _MAPPING_NAME.match(stale.name) and stale.name not in files and stale.is_file():
            stale.unlink(missing_ok=True)


def export(machine: Machine, grants: Iterable[GrantLike]) -> str | None:
    """Write the telemetry for `grants` (those in force now); None, or what could not be written."""
    from rediacc_core.model import Inventory

    grants = list(grants)
    try:
        mapping_dir = effective(read_settings(machine))[DCGM_JOB_MAPPING_DIR.name]
        inventory = read_inventory(machine) or Inventory()
        names = {repo.id: repo.name for repo in RepoStore(machine).list()} if grants else {}
        _write_if_changed(metrics_path(machine), grant_info_text(grants, names, inventory))
        if mapping_dir:
            write_job_mapping(machine.path(mapping_dir), job_mapping(grants, names, inventory))
    except RdcError as exc:
        return f"GPU telemetry not written: {exc.what}"
    except OSError as exc:
        return f"GPU telemetry not written: {exc}"
    return None
