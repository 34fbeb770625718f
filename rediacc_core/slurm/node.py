"""Whether a machine is a Slurm node: it has the gres map `rdc slurm gres` wrote. Light on purpose:
`rdc repo list` and `rdc repo gpu list|revoke|confirm` ask it before loading Slurm's rooms (twice the
start-up of `rdc repo` on their own), so a machine without Slurm never pays for them."""

from __future__ import annotations

from rediacc_core.machine import Machine

MAP_PATH = "/etc/rediacc/slurm/gres-map.json"


def is_slurm_node(machine: Machine) -> bool:
    return machine.path(MAP_PATH).exists()
