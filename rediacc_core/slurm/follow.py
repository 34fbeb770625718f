"""What setup, refresh and `rdc machine gpu clear` do for Slurm: the node's gres.conf and index map
follow the inventory (when `rdc slurm gres` wrote them once), its cards' health reaches the node
(drained or resumed), and the reconciler runs; and what a confirm or a revoke does (a node drained
for a suspended grant is resumed once none is left)."""

from __future__ import annotations

from rediacc_core.errors import RdcError
from rediacc_core.grants.records import read_grants
from rediacc_core.machine import Machine
from rediacc_core.slurm import gres
from rediacc_core.slurm.drains import sync
from rediacc_core.slurm.reconcile import reconcile


def after_setup(machine: Machine) -> list[str]:
    """Notes for the operator: a gres.conf rewritten (slurmd reads it at its restart), grants of
    ended jobs revoked, or why either could not be done (setup itself stands)."""
    notes: list[str] = []
    try:
        found = gres.read_map(machine)
        if found is not None:
            now = gres.write(machine, found.node, found.conf)
            if now.generation != found.generation:
                notes.append(
                    f"The GPUs changed: {found.conf} and the gres map are rewritten (generation "
                    f"{now.generation}); restart slurmd on {found.node} so Slurm reads them, and check "
                    f"slurm.conf's line: {gres.node_line(found.node, now.entries, now.features)}"
                )
    except RdcError as exc:
        notes.append(f"Slurm: gres.conf not rewritten: {exc.what}")
    try:
        done = sync(machine)
        if done:
            notes.append(f"Slurm: {done}.")
    except RdcError as exc:
        notes.append(f"Slurm: the node's health not passed on: {exc.what}")
    if any(g.job is not None for g in read_grants(machine)):
        try:
            held = reconcile(machine)
            for grant in held.revoked:
                notes.append(f"Slurm: revoked {grant.device}: job {grant.job} no longer runs.")
            for grant, end in held.renewed:
                notes.append(f"Slurm: renewed {grant.device} until {end}, the new end of job {grant.job}.")
        except RdcError as exc:
            notes.append(f"Slurm: grants of ended jobs not checked: {exc.what}")
    return notes


def after_grants_change(machine: Machine) -> str | None:
    """After `rdc repo gpu confirm` or `revoke` on a Slurm node: the node drained or resumed for
    its suspended grants and its cards' health; a note for the operator, or None."""
    try:
        done = sync(machine)
    except RdcError as exc:
        return f"Slurm: the node's state not updated: {exc.what}"
    return f"Slurm: {done}." if done else None
