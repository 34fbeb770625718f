"""Discovery on simulated machines: nvidia-smi (XML + CSV + -L), /proc, WSL, and failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from rediacc_nvidia import testing
from rediacc_nvidia.discovery import discover

from rediacc_core import GpuPartition
from rediacc_core.errors import ToolError
from rediacc_core.testing import FakeMachine

A100_UUID = "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"


def test_a100_with_mig_combines_xml_query_and_list(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("a100")
    testing.nvidia_machine(
        fm,
        capture("nvidia-smi-q-x/a100-sxm4-40gb-mig_510.47.03.xml"),
        compute_caps=["8.0"],
        mig_profiles={0: ["3g.20gb", "3g.20gb"]},
    )
    (gpu,) = discover(fm.machine)
    assert (gpu.vendor, gpu.source, gpu.driver) == ("nvidia", "nvidia", "nvidia")
    assert (gpu.index, gpu.name, gpu.pci_bus_id) == (0, "NVIDIA A100-SXM4-40GB", "0000:00:04.0")
    assert (gpu.driver_version, gpu.memory_mib) == ("510.47.03", 40960)
    assert gpu.cdi_names == ("nvidia.com/gpu=0", f"nvidia.com/gpu={A100_UUID}")
    assert dict(gpu.attributes) == {
        "uuid": A100_UUID,
        "minor": 0,
        "cudaDriverVersion": "11.6",
        "computeCapability": "8.0",
        "brand": "NVIDIA",
        "architecture": "Ampere",
        "migMode": "Enabled",
        "platform": "native",
    }
    mig0 = "MIG-00000000-0000-0000-0000-000000000000"
    mig1 = "MIG-00000001-0000-0000-0000-000000000001"
    assert gpu.partitions == (
        GpuPartition(
            index=0,
            uuid=mig0,
            profile="3g.20gb",
            memory_mib=19968,
            cdi_names=("nvidia.com/gpu=0:0", f"nvidia.com/gpu={mig0}"),
            attributes={"gpuInstanceId": 1, "computeInstanceId": 0},
        ),
        GpuPartition(
            index=1,
            uuid=mig1,
            profile="3g.20gb",
            memory_mib=19968,
            cdi_names=("nvidia.com/gpu=0:1", f"nvidia.com/gpu={mig1}"),
            attributes={"gpuInstanceId": 2, "computeInstanceId": 0},
        ),
    )


def test_two_gpus_keep_index_order_and_their_own_minors(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("a5000")
    testing.nvidia_machine(
        fm, capture("nvidia-smi-q-x/rtx-a5000-x2_590.44.01.xml"), compute_caps=["8.6", "8.6"]
    )
    gpus = discover(fm.machine)
    assert [(g.index, g.pci_bus_id, g.attributes["minor"]) for g in gpus] == [
        (0, "0000:81:00.0", 1),
        (1, "0000:c1:00.0", 0),
    ]
    assert [g.cdi_names[0] for g in gpus] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    assert all(g.attributes["computeCapability"] == "8.6" for g in gpus)
    assert all(g.attributes["brand"] == "NVIDIA RTX" and g.attributes["migMode"] is None for g in gpus)


def test_old_driver_without_compute_cap_field_still_discovers(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("p400")
    testing.nvidia_machine(fm, capture("nvidia-smi-q-x/quadro-p400_418.43.xml"))  # query rejects compute_cap
    (gpu,) = discover(fm.machine)
    assert gpu.name == "Quadro P400"
    assert gpu.attributes["computeCapability"] is None
    assert gpu.attributes["migMode"] is None
    assert gpu.attributes["cudaDriverVersion"] == "10.1"


def test_real_query_capture_supplies_compute_capability(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    # The stand-in answers --query-gpu from a real 212-column capture, matched by index.
    fm = make_fake_machine("t4")
    testing.nvidia_machine(
        fm,
        capture("nvidia-smi-q-x/tesla-t4_515.105.01.xml"),
        query_output=capture("nvidia-smi-query/rtx-2080-super-windows_610.62_idle.csv"),
    )
    (gpu,) = discover(fm.machine)
    assert gpu.attributes["computeCapability"] == "7.5"


def test_proc_is_the_last_resort(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("proc")
    testing.nvidia_machine(fm, capture("nvidia-smi-q-x/rtx-a5000-x2_590.44.01.xml"))
    (fm.bin_dir / "nvidia-smi").unlink()
    gpus = discover(fm.machine)
    assert [(g.index, g.pci_bus_id, g.attributes["minor"], g.driver_version) for g in gpus] == [
        (0, "0000:81:00.0", 1, "590.44.01"),
        (1, "0000:c1:00.0", 0, "590.44.01"),
    ]
    assert gpus[1].cdi_names == (
        "nvidia.com/gpu=1",
        "nvidia.com/gpu=GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
    )
    assert gpus[0].memory_mib is None, "/proc has no memory size"


def test_proc_parses_the_open_kernel_module_version(make_fake_machine: Callable[[str], FakeMachine]) -> None:
    from rediacc_nvidia.discovery_proc import parse_version

    assert parse_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.54.03  Release Build"
    ) == ("535.54.03")
    assert parse_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  418.43  Tue Feb 19 01:12:11 CST 2019"
    ) == ("418.43")


def test_failing_nvidia_smi_falls_back_to_proc(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("flaky")
    testing.nvidia_machine(fm, capture("nvidia-smi-q-x/tesla-t4_515.105.01.xml"))
    (testing.data_dir(fm) / "fail").write_text("9\nNVIDIA-SMI has failed\n")
    (gpu,) = discover(fm.machine)
    assert gpu.name == "Tesla T4"


def test_failing_nvidia_smi_with_driver_but_no_gpu_entries_is_a_tool_error(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("broken")
    testing.nvidia_machine(fm, capture("nvidia-smi-q-x/tesla-t4_515.105.01.xml"))
    (testing.data_dir(fm) / "fail").write_text(
        "15\nUnable to determine the device handle for GPU0000:00:1E.0\n"
    )
    for info in fm.path("/proc/driver/nvidia/gpus").glob("*/information"):
        info.unlink()
    with pytest.raises(ToolError) as raised:
        discover(fm.machine)
    assert "exit 15" in raised.value.what and "device handle" in raised.value.what
    assert "nvidia-smi" in raised.value.todo


def test_nvidia_smi_without_a_loaded_driver_finds_nothing(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("unloaded")
    testing.nvidia_machine(fm, capture("nvidia-smi-q-x/tesla-t4_515.105.01.xml"), driver_loaded=False)
    assert discover(fm.machine) == []


def test_machine_without_nvidia_finds_nothing(make_fake_machine: Callable[[str], FakeMachine]) -> None:
    fm = make_fake_machine("plain")
    fm.mkdir("/dev")
    assert discover(fm.machine) == []


def test_a_rooted_machine_never_runs_the_hosts_nvidia_smi(
    capture: Callable[[str], str],
    make_fake_machine: Callable[[str], FakeMachine],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The "host": an nvidia-smi that reports a T4, first on PATH (as a real GPU host has one).
    host = make_fake_machine("host")
    testing.nvidia_machine(host, capture("nvidia-smi-q-x/tesla-t4_515.105.01.xml"))
    monkeypatch.setenv("PATH", f"{host.bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    plain = make_fake_machine("plain")
    plain.mkdir("/dev")
    assert discover(plain.machine) == [], "the host's nvidia-smi was taken for the machine's"
    assert plain.machine.which("nvidia-smi") is None
    assert host.machine.which("nvidia-smi") == str(host.path("/usr/bin/nvidia-smi")), "its own tool"


def test_wsl_uses_the_windows_drivers_nvidia_smi(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("wsl")
    testing.wsl_machine(fm, capture("nvidia-smi-q-x/rtx-3080-windows_536.40.xml"), compute_caps=["8.6"])
    assert not (fm.bin_dir / "nvidia-smi").exists(), "only /usr/lib/wsl/lib/nvidia-smi exists"
    (gpu,) = discover(fm.machine)
    assert gpu.name == "NVIDIA GeForce RTX 3080"
    assert gpu.attributes["platform"] == "wsl"
    assert gpu.attributes["minor"] is None, "WDDM GPUs have no minor number"
    assert gpu.attributes["computeCapability"] == "8.6"


def test_nvml_is_not_used_for_a_machine_whose_root_is_a_directory(
    capture: Callable[[str], str], make_fake_machine: Callable[[str], FakeMachine]
) -> None:
    fm = make_fake_machine("notnvml")
    testing.nvidia_machine(fm, capture("nvidia-smi-q-x/tesla-t4_515.105.01.xml"))

    def loader() -> object:
        raise AssertionError("NVML must not be loaded for a simulated machine")

    (gpu,) = discover(fm.machine, nvml_loader=loader)
    assert gpu.name == "Tesla T4"


def test_ready_made_layouts_discover(realdata: Path, make_fake_machine: Callable[[str], FakeMachine]) -> None:
    found = {}
    for name in testing.LAYOUTS:
        fm = make_fake_machine(name)
        testing.layout(fm, name)
        found[name] = [
            (gpu.index, gpu.attributes["computeCapability"], gpu.attributes["platform"])
            for gpu in discover(fm.machine)
        ]
    assert found == {
        "a100-mig": [(0, "8.0", "native")],
        "a5000-x2": [(0, "8.6", "native"), (1, "8.6", "native")],
        "t4": [(0, "7.5", "native")],
        "p400-418": [(0, None, "native")],
        "wsl-rtx3080": [(0, "8.6", "wsl")],
    }
