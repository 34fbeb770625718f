"""Slurm as one of rdc's own plugins (tox's way: built-ins register as any plugin would, through the
`rediacc` entry points): every repo gate's housekeeping round runs the machine's Slurm round
(`slurm.round`), which does nothing on a machine that is no Slurm node."""

from __future__ import annotations

from collections.abc import Callable

from rediacc_core import hookimpl
from rediacc_core.machine import Machine
from rediacc_core.slurm.round import slurm_round


@hookimpl
def rdc_housekeeping(
    machine: Machine, repo_id: str, log: Callable[[str], None]
) -> list[Callable[[], object]]:
    return [lambda: slurm_round(machine, repo_id, log)]
