"""The NVIDIA part of `rdc demo`: two data-centre GPUs, one of them split into MIG slices.

The report is written here rather than read from a capture, so the demo runs from an installed
package with nothing beside it.
"""

from __future__ import annotations

from rediacc_core.testing import FakeMachine
from rediacc_nvidia.testing import nvidia_machine

_GPU = """  <gpu id="{bus}">
    <product_name>NVIDIA H100 80GB HBM3</product_name>
    <product_brand>NVIDIA</product_brand>
    <product_architecture>Hopper</product_architecture>
    <mig_mode><current_mig>{mig}</current_mig><pending_mig>{mig}</pending_mig></mig_mode>
    <mig_devices>{migs}</mig_devices>
    <uuid>GPU-{uuid}</uuid>
    <minor_number>{minor}</minor_number>
    <pci><pci_bus_id>{bus}</pci_bus_id></pci>
    <fb_memory_usage><total>81559 MiB</total><used>0 MiB</used><free>81079 MiB</free></fb_memory_usage>
  </gpu>
"""
_MIG = """
      <mig_device><index>{index}</index><gpu_instance_id>{gi}</gpu_instance_id>
        <compute_instance_id>0</compute_instance_id>
        <fb_memory_usage><total>40192 MiB</total><used>0 MiB</used></fb_memory_usage></mig_device>"""


def _report() -> str:
    migs = "".join(_MIG.format(index=i, gi=gi) for i, gi in ((0, 1), (1, 2)))
    gpus = _GPU.format(
        bus="00000000:17:00.0", mig="Disabled", migs="", uuid="8f3a0c2e-5b1d-4e7a-9c60-1d2e3f405a61", minor=0
    )
    gpus += _GPU.format(
        bus="00000000:65:00.0", mig="Enabled", migs=migs, uuid="2b7e91d4-0c3f-4a58-b6e2-7f8091a2b3c4", minor=1
    )
    return (
        '<?xml version="1.0" ?>\n<nvidia_smi_log>\n  <driver_version>590.48.01</driver_version>\n'
        f"  <cuda_version>13.1</cuda_version>\n  <attached_gpus>2</attached_gpus>\n{gpus}</nvidia_smi_log>\n"
    )


def demo_layout(fm: FakeMachine) -> None:
    """Lay out the demo's NVIDIA GPUs, their driver files and a stand-in toolkit on `fm`."""
    nvidia_machine(fm, _report(), compute_caps=("9.0", "9.0"), mig_profiles={1: ("3g.40gb", "3g.40gb")})
