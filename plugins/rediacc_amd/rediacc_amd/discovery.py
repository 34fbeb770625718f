"""`rdc_discover` for AMD: the KFD topology's GPUs, on machines where `/dev/kfd` exists."""

from __future__ import annotations

from rediacc_amd.kfd import TOPOLOGY, AmdGpu, gpus_from_nodes, read_topology
from rediacc_core import Gpu, Machine

KIND = "rediacc.io/amd"
SOURCE = "amd"
DRIVER = "amdgpu"
KFD_NODE = "/dev/kfd"


def amd_gpus(machine: Machine) -> list[AmdGpu]:
    # Without /dev/kfd no container can compute on the cards, whatever sysfs still lists.
    if not machine.path(KFD_NODE).exists():
        return []
    return gpus_from_nodes(read_topology(machine.path(TOPOLOGY)))


def cdi_name(index: int | str) -> str:
    return f"{KIND}=gpu{index}" if isinstance(index, int) else f"{KIND}={index}"


def gpu_of(gpu: AmdGpu, driver_version: str | None) -> Gpu:
    return Gpu(
        vendor="amd",
        source=SOURCE,
        name=gpu.name,
        index=gpu.index,
        pci_bus_id=gpu.pci_bus_id,
        driver=DRIVER,
        driver_version=driver_version,
        memory_mib=gpu.memory_mib,
        cdi_names=(cdi_name(gpu.index),),
        attributes={
            "renderMinor": gpu.render_minor,
            "gpuId": gpu.gpu_id,
            "gfxTarget": gpu.gfx_target,
            "partition": gpu.partition,
            "kfdNode": gpu.node,
            "pciDeviceId": f"0x{gpu.device_id:04x}" if gpu.device_id else None,
            # 64-bit: kept as text so JSON readers in any language see it unchanged.
            "uniqueId": str(gpu.unique_id) if gpu.unique_id else None,
        },
    )


def discover(machine: Machine) -> list[Gpu]:
    found = amd_gpus(machine)
    if not found:
        return []
    # The packaged (DKMS) driver publishes its version; the in-tree one follows the kernel.
    version_file = machine.path(f"/sys/module/{DRIVER}/version")
    try:
        version: str | None = version_file.read_text(encoding="utf-8").strip() or None
    except OSError:
        version = None
    return [gpu_of(gpu, version) for gpu in found]
