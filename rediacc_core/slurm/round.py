"""Slurm in each repo gate's housekeeping round: on a machine that is a Slurm node (it has a gres
map), the reconciler and the health sync run every round, so a grant whose job died with its node
is revoked and a held card drains the node within a round, with no timer to set up.

Several repos' gates on one machine share one round: the first to take the machine's lock file,
when the last round is at least `ROUND_SECONDS` old, runs it and stamps it; the others skip it. It
runs on the housekeeping thread, never the gate's event loop, and every Slurm command has the
client's time limit. It also writes each repo's GPU seconds of the month (`slurm.usage`) for
node_exporter, beside the gates' counters. What it changed is in the gate's log; revokes and
renewals are in the repo's audit log (the reconciler writes them) and a drain or resume in the audit
log of the gate that ran it.

The gate finds it as a plugin (`slurm.plugin`, the `rdc_housekeeping` hook): the gate's floor may
not import Slurm's, and a site without Slurm can leave it out (`REDIACC_LOAD_PLUGINS`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import filelock

from rediacc_core.errors import RdcError
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore
from rediacc_core.slurm.drains import sync
from rediacc_core.slurm.gres import read_map
from rediacc_core.slurm.hooks import audit
from rediacc_core.slurm.reconcile import reconcile
from rediacc_core.slurm.usage import write_metrics

ROUND_SECONDS = 25.0  # under the housekeeping interval (30 s), so each round of some gate runs it


def round_paths(machine: Machine) -> tuple[Path, Path]:
    """The lock file and the stamp (the last round's time, in its text) of the machine's round."""
    base = machine.state_dir / "slurm"
    return base / "round.lock", base / "round.at"


def _due(stamp: Path, now: float) -> bool:
    try:
        return now - float(stamp.read_text().strip()) >= ROUND_SECONDS
    except (OSError, ValueError):
        return True


def slurm_round(machine: Machine, repo_id: str, log: Callable[[str], None]) -> bool:
    """Run the machine's round if it is a Slurm node and no gate ran it lately; whether it ran."""
    if read_map(machine) is None or machine.which("squeue") is None:
        return False  # no Slurm node, or a box of external mode: the bridge reconciles it
    lock_path, stamp = round_paths(machine)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with filelock.FileLock(str(lock_path), timeout=0):
            now = time.time()
            if not _due(stamp, now):
                return False
            stamp.write_text(f"{now}\n")
            _run(machine, repo_id, log)
    except filelock.Timeout:  # another gate of this machine runs it now
        return False
    return True


def _run(machine: Machine, repo_id: str, log: Callable[[str], None]) -> None:
    try:
        done = reconcile(machine)
        for grant in done.revoked:
            log(f"Slurm: revoked {grant.device} (job {grant.job}, which Slurm no longer runs)")
        for grant, end in done.renewed:
            log(f"Slurm: renewed {grant.device} until {end} (job {grant.job}'s new end)")
    except RdcError as exc:
        log(f"Slurm: not reconciled: {exc.what}")
    try:
        write_metrics(machine, RepoStore(machine).list(), time.time())
    except RdcError as exc:
        log(f"Slurm: GPU hours not counted: {exc.what}")
    try:
        changed = sync(machine)
    except RdcError as exc:
        log(f"Slurm: health not passed on: {exc.what}")
        return
    if changed:
        log(f"Slurm: {changed}")
        audit(machine, RepoStore(machine).by_id(repo_id), "slurm-health", [], changed)
