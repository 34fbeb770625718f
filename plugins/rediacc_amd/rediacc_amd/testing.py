"""AMD GPUs on a simulated machine: a KFD topology, `/dev/kfd`, and each GPU's render node.

For tests of this plugin and of anything built on it. `install_kfd_capture` copies a real topology
(stored captures under `REALDATA/kfd`) byte for byte; `add_amd_gpu` and `add_cpu_node` write nodes
in the same format for machines no capture describes. Either way every GPU node also gets what the
kernel would make for it: the card's PCI function, and a render node under `/sys/class/drm` and
`/dev/dri`. Partitions after the first hang off platform devices (`amdgpu_xcp.<k>`), as on a real
partitioned card.
"""

from __future__ import annotations

from pathlib import Path

from rediacc_amd.kfd import TOPOLOGY, gpus_from_nodes, read_topology
from rediacc_core.testing import FakeMachine, real_capture

KFD_MAJOR = 238  # dynamic on real machines; any free number does here
RENDER_MAJOR = 226
AMD_VENDOR = 0x1002


def kfd_capture_dir(name: str) -> Path:
    """The `topology/` directory of a stored capture, e.g. `kfd_capture_dir("mi300x-cpx")` (the
    test skips when the captures are not here)."""
    return real_capture("kfd", name, "topology")


def add_kfd_node(fm: FakeMachine, major: int = KFD_MAJOR) -> None:
    """`/dev/kfd` and its sysfs entry."""
    fm.write("/sys/class/kfd/kfd/dev", f"{major}:0\n")
    fm.char_device("/dev/kfd", major, 0)


def install_kfd_capture(fm: FakeMachine, capture: str | Path, kfd: bool = True) -> None:
    """Copy a captured topology into `/sys/class/kfd/kfd/topology` and make each GPU's nodes.

    `kfd=False` leaves out `/dev/kfd`, as on a machine whose driver is loaded without compute.
    """
    source = capture if isinstance(capture, Path) else kfd_capture_dir(capture)
    fm.copy_tree(source, TOPOLOGY)
    if kfd:
        add_kfd_node(fm)
    _add_render_nodes(fm)


def add_cpu_node(fm: FakeMachine, node: int, cores: int = 64, memory_bytes: int = 64 << 30) -> None:
    base = f"{TOPOLOGY}/nodes/{node}"
    fm.write(f"{base}/gpu_id", "0\n")
    fm.write(f"{base}/name", "\n")
    props = {"cpu_cores_count": cores, "simd_count": 0, "mem_banks_count": 1, "vendor_id": 0, "device_id": 0}
    props |= {"location_id": 0, "domain": 0, "drm_render_minor": 0}
    fm.write(f"{base}/properties", _properties(props))
    fm.write(f"{base}/mem_banks/0/properties", _properties({"heap_type": 0, "size_in_bytes": memory_bytes}))


def add_amd_gpu(
    fm: FakeMachine,
    node: int,
    bdf: str,
    render_minor: int,
    device_id: int = 0x740F,
    gfx_target_version: int = 90010,
    vram_bytes: int | None = 64 << 30,
    gpu_id: int | None = None,
    unique_id: int = 0,
    simd_count: int = 416,
) -> None:
    """One GPU node in the kernel's format (an MI210 unless told otherwise).

    Call `add_kfd_node` and `finish_topology` once the nodes are in place.
    """
    domain, bus, rest = bdf.lower().split(":")
    dev, fn = rest.split(".")
    location = (int(bus, 16) << 8) | (int(dev, 16) << 3) | int(fn)
    base = f"{TOPOLOGY}/nodes/{node}"
    fm.write(f"{base}/gpu_id", f"{gpu_id if gpu_id is not None else 1000 + node}\n")
    fm.write(f"{base}/name", "ip discovery\n")
    props = {
        "cpu_cores_count": 0,
        "simd_count": simd_count,
        "mem_banks_count": 1 if vram_bytes else 0,
        "gfx_target_version": gfx_target_version,
        "vendor_id": AMD_VENDOR,
        "device_id": device_id,
        "location_id": location,
        "domain": int(domain, 16),
        "drm_render_minor": render_minor,
        "local_mem_size": 0,
        "unique_id": unique_id,
        "num_xcc": 1,
    }
    fm.write(f"{base}/properties", _properties(props))
    if vram_bytes:
        bank = {"heap_type": 1, "size_in_bytes": vram_bytes, "flags": 0, "width": 4096, "mem_clk_max": 1600}
        fm.write(f"{base}/mem_banks/0/properties", _properties(bank))


def finish_topology(fm: FakeMachine) -> None:
    """The render nodes of every GPU node written so far."""
    fm.write(f"{TOPOLOGY}/generation_id", "1\n")
    _add_render_nodes(fm)


def two_amd_gpus(fm: FakeMachine) -> None:
    """A two-socket server with two MI210s: 0000:03:00.0 (renderD128) and 0000:83:00.0 (renderD129)."""
    add_cpu_node(fm, 0)
    add_cpu_node(fm, 1)
    add_amd_gpu(fm, 2, "0000:83:00.0", 129, unique_id=5847760019078012339)
    add_amd_gpu(fm, 3, "0000:03:00.0", 128, unique_id=1801979520617338022)
    add_kfd_node(fm)
    finish_topology(fm)


def _add_render_nodes(fm: FakeMachine) -> None:
    nodes = {n.node: n for n in read_topology(fm.path(TOPOLOGY))}
    platform_devices = 0
    for gpu in gpus_from_nodes(list(nodes.values())):
        if not gpu.partition:
            device_id = nodes[gpu.node].properties.get("device_id", 0)
            parent = fm.pci_device(gpu.pci_bus_id, AMD_VENDOR, device_id, driver="amdgpu")
        else:
            # The kernel registers partitions after the first as platform devices, numbered from 0.
            parent = f"/sys/devices/platform/amdgpu_xcp.{platform_devices}"
            platform_devices += 1
            fm.write(f"{parent}/uevent", "DRIVER=amdgpu_xcp_drv\nMODALIAS=platform:amdgpu_xcp\n")
        _render_node(fm, parent, gpu.render_minor)


def _render_node(fm: FakeMachine, parent: str, minor: int) -> None:
    entry = f"{parent}/drm/renderD{minor}"
    fm.write(f"{entry}/dev", f"{RENDER_MAJOR}:{minor}\n")
    fm.symlink(f"{entry}/device", parent)
    fm.symlink(f"/sys/class/drm/renderD{minor}", entry)
    fm.char_device(f"/dev/dri/renderD{minor}", RENDER_MAJOR, minor)


def _properties(values: dict[str, int]) -> str:
    return "".join(f"{key} {value}\n" for key, value in values.items())
