"""The AMD part of `rdc demo`: two MI210 cards behind /dev/kfd."""

from __future__ import annotations

from rediacc_amd.testing import add_amd_gpu, add_cpu_node, add_kfd_node, finish_topology
from rediacc_core.testing import FakeMachine


def demo_layout(fm: FakeMachine) -> None:
    """Two MI210s at 0000:03:00.0 and 0000:83:00.0 (renderD129 and renderD130; 128 is left to others)."""
    add_cpu_node(fm, 0)
    add_cpu_node(fm, 1)
    add_amd_gpu(fm, 2, "0000:03:00.0", 129, unique_id=1801979520617338022)
    add_amd_gpu(fm, 3, "0000:83:00.0", 130, unique_id=5847760019078012339)
    add_kfd_node(fm)
    finish_topology(fm)
