"""`nvidia-smi -q -x` parsing, asserted value by value against every real capture."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rediacc_nvidia.discovery_smi import SmiParseError, XmlMig, parse_xml

# file: (driver, cuda, [(name, brand, uuid, minor, bus id, MiB, MIG mode, MIG devices)])
EXPECTED: dict[str, tuple[str, str, list[tuple[Any, ...]]]] = {
    "a100-sxm4-40gb-mig_510.47.03.xml": (
        "510.47.03",
        "11.6",
        [
            (
                "NVIDIA A100-SXM4-40GB",
                "NVIDIA",
                "GPU-27b94a00-ed54-5c24-b1fd-1054085de32a",
                0,
                "0000:00:04.0",
                40960,
                "Enabled",
                [XmlMig(0, 1, 0, 19968), XmlMig(1, 2, 0, 19968)],
            ),
        ],
    ),
    "a100-sxm4-80gb-mig_535.54.03.xml": (
        "535.54.03",
        "12.2",
        [
            (
                "NVIDIA A100-SXM4-80GB",
                "NVIDIA",
                "GPU-513536b6-7d19-9063-b049-1e69664bb298",
                1,
                "0000:01:00.0",
                81920,
                "Enabled",
                [
                    XmlMig(0, 3, 0, 19968),
                    XmlMig(1, 4, 0, 19968),
                    XmlMig(2, 5, 0, 19968),
                    XmlMig(3, 6, 0, 19968),
                ],
            ),
        ],
    ),
    "a10g_515.105.01.xml": (
        "515.105.01",
        "11.7",
        [
            (
                "NVIDIA A10G",
                "NVIDIA",
                "GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",
                0,
                "0000:00:1e.0",
                23028,
                None,
                [],
            ),
        ],
    ),
    "quadro-p2000_525.125.06.xml": (
        "525.125.06",
        "12.0",
        [
            (
                "Quadro P2000",
                "Quadro",
                "GPU-396caaed-39ca-3199-2e68-717cdb786ec6",
                0,
                "0000:17:00.0",
                5120,
                None,
                [],
            ),
        ],
    ),
    "quadro-p400_418.43.xml": (
        "418.43",
        "10.1",
        [
            (
                "Quadro P400",
                "Quadro",
                "GPU-8f750be4-dfbc-23b9-b33f-da729a536494",
                0,
                "0000:43:00.0",
                1998,
                None,
                [],
            ),
        ],
    ),
    "rtx-2080-windows_516.59.xml": (
        "516.59",
        "11.7",
        [
            (
                "NVIDIA GeForce RTX 2080",
                "GeForce",
                "GPU-fbd55ed4-1eec-4423-0a47-ad594b4333e3",
                None,
                "0000:0a:00.0",
                8192,
                None,
                [],
            ),
        ],
    ),
    "rtx-3060-laptop_515.65.01.xml": (
        "515.65.01",
        "11.7",
        [
            (
                "NVIDIA GeForce RTX 3060 Laptop GPU",
                "GeForce",
                "GPU-473d8d0f-d462-185c-6b36-6fc23e23e571",
                0,
                "0000:01:00.0",
                6144,
                None,
                [],
            ),
        ],
    ),
    "rtx-3060_570.124.04.xml": (
        "570.124.04",
        "12.8",
        [
            (
                "NVIDIA GeForce RTX 3060",
                "GeForce",
                "GPU-d6889ff6-2523-9142-ca3c-1ca3f396a625",
                0,
                "0000:2d:00.0",
                12288,
                None,
                [],
            ),
        ],
    ),
    "rtx-3080-windows_536.40.xml": (
        "536.40",
        "12.2",
        [
            (
                "NVIDIA GeForce RTX 3080",
                "GeForce",
                "GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
                None,
                "0000:04:00.0",
                10240,
                None,
                [],
            ),
        ],
    ),
    "rtx-3080_595.58.03.xml": (
        "595.58.03",
        "13.2",
        [
            (
                "NVIDIA GeForce RTX 3080",
                "GeForce",
                "GPU-19d6d965-2acc-f646-00f8-4c76979aabb4",
                0,
                "0000:0c:00.0",
                10240,
                None,
                [],
            ),
        ],
    ),
    "rtx-3090_525.147.05.xml": (
        "525.147.05",
        "12.0",
        [
            (
                "NVIDIA GeForce RTX 3090",
                "GeForce",
                "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
                0,
                "0000:00:10.0",
                24576,
                None,
                [],
            ),
        ],
    ),
    "rtx-4000-sff-ada_595.84.xml": (
        "595.84",
        "13.2",
        [
            (
                "NVIDIA RTX 4000 SFF Ada Generation",
                "NVIDIA RTX",
                "GPU-37037c3f-65c8-ec4d-24a9-420204ad8026",
                0,
                "0000:06:00.0",
                20475,
                None,
                [],
            ),
        ],
    ),
    "rtx-4090_535.86.05.xml": (
        "535.86.05",
        "12.2",
        [
            (
                "NVIDIA GeForce RTX 4090",
                "GeForce",
                "GPU-71d1acc2-662d-2166-bf9f-65272d2fc437",
                0,
                "0000:84:00.0",
                24564,
                None,
                [],
            ),
        ],
    ),
    "rtx-a5000-x2_590.44.01.xml": (
        "590.44.01",
        "13.1",
        [
            (
                "NVIDIA RTX A5000",
                "NVIDIA RTX",
                "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
                1,
                "0000:81:00.0",
                24564,
                None,
                [],
            ),
            (
                "NVIDIA RTX A5000",
                "NVIDIA RTX",
                "GPU-12345678-aaaa-bbbb-cccc-0123456789cd",
                0,
                "0000:c1:00.0",
                24564,
                None,
                [],
            ),
        ],
    ),
    "rtx-pro-6000-blackwell-maxq_590.44.01.xml": (
        "590.44.01",
        "13.1",
        [
            (
                "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
                "NVIDIA RTX",
                "GPU-12345678-aaaa-bbbb-cccc-0123456789ab",
                0,
                "0000:61:00.0",
                97887,
                None,
                [],
            ),
        ],
    ),
    "tesla-p100-pcie-16gb_510.47.03.xml": (
        "510.47.03",
        "11.6",
        [
            (
                "Tesla P100-PCIE-16GB",
                "Tesla",
                "GPU-d3da8716-eaab-75db-efc1-60e88e1cd55e",
                0,
                "0000:00:04.0",
                16384,
                None,
                [],
            ),
        ],
    ),
    "tesla-t4_515.105.01.xml": (
        "515.105.01",
        "11.7",
        [
            (
                "Tesla T4",
                "NVIDIA",
                "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
                0,
                "0000:00:1e.0",
                15360,
                None,
                [],
            ),
        ],
    ),
}


def test_every_capture_has_expected_values(realdata: Path) -> None:
    on_disk = sorted(path.name for path in (realdata / "nvidia-smi-q-x").glob("*.xml"))
    assert on_disk == sorted(EXPECTED), "a capture was added or removed: give it expected values here"


@pytest.mark.parametrize("filename", sorted(EXPECTED))
def test_capture_is_read_exactly(realdata: Path, filename: str) -> None:
    driver, cuda, gpus = EXPECTED[filename]
    report = parse_xml((realdata / "nvidia-smi-q-x" / filename).read_text(encoding="utf-8"))
    assert (report.driver_version, report.cuda_version) == (driver, cuda)
    assert len(report.gpus) == len(gpus)
    for index, (gpu, expected) in enumerate(zip(report.gpus, gpus, strict=True)):
        name, brand, uuid, minor, bus, memory, mig_mode, migs = expected
        assert gpu.index == index, "GPUs are numbered in document order, as nvidia-smi numbers them"
        assert (gpu.name, gpu.brand, gpu.uuid, gpu.minor) == (name, brand, uuid, minor)
        assert (gpu.pci_bus_id, gpu.memory_mib, gpu.mig_mode) == (bus, memory, mig_mode)
        assert list(gpu.migs) == migs


def test_oldest_format_has_no_mig_mode_or_architecture(realdata: Path) -> None:
    report = parse_xml((realdata / "nvidia-smi-q-x/quadro-p400_418.43.xml").read_text(encoding="utf-8"))
    assert report.gpus[0].mig_mode is None
    assert report.gpus[0].architecture is None


def test_minor_numbers_do_not_follow_index(realdata: Path) -> None:
    report = parse_xml((realdata / "nvidia-smi-q-x/rtx-a5000-x2_590.44.01.xml").read_text(encoding="utf-8"))
    assert [(gpu.index, gpu.minor) for gpu in report.gpus] == [(0, 1), (1, 0)]


def test_broken_xml_is_an_error_that_says_so() -> None:
    with pytest.raises(SmiParseError, match="does not parse"):
        parse_xml("<nvidia_smi_log><gpu>")
    with pytest.raises(SmiParseError, match="expected <nvidia_smi_log>"):
        parse_xml("<something/>")
