"""`nvidia-smi --query-gpu` CSV and `nvidia-smi -L`, asserted against every real capture."""

from __future__ import annotations

from pathlib import Path

import pytest
from rediacc_nvidia.discovery_smi import ListedMig, SmiParseError, parse_list, parse_query_csv
from rediacc_nvidia.values import mib_or_none, normalise_bus_id

ZERO_GPU = "GPU-00000000-0000-0000-0000-000000000000"

# file: (index, uuid, bus id, MiB, compute_cap, mig.mode.current, name)
QUERY = {
    "h100-80gb-hbm3-mig_590.48.01_idle.csv": (
        "0",
        ZERO_GPU,
        "0000:00:09.0",
        81559,
        "9.0",
        "Enabled",
        "NVIDIA H100 80GB HBM3",
    ),
    "h100-80gb-hbm3_590.48.01_idle.csv": (
        "0",
        ZERO_GPU,
        "0000:00:09.0",
        81559,
        "9.0",
        "Disabled",
        "NVIDIA H100 80GB HBM3",
    ),
    "h200-mig_590.48.01_idle.csv": ("0", ZERO_GPU, "0000:83:00.0", 143771, "9.0", "Enabled", "NVIDIA H200"),
    "h200_590.48.01_idle.csv": ("0", ZERO_GPU, "0000:83:00.0", 143771, "9.0", "Disabled", "NVIDIA H200"),
    "l40s_595.80_idle.csv": ("0", ZERO_GPU, "0000:01:00.0", 46068, "8.9", None, "NVIDIA L40S"),
    "rtx-2080-super-windows_610.62_idle.csv": (
        "0",
        ZERO_GPU,
        "0000:0c:00.0",
        8192,
        "7.5",
        None,
        "NVIDIA GeForce RTX 2080 SUPER",
    ),
    "rtx-4080-super_595.71.05_idle.csv": (
        "0",
        ZERO_GPU,
        "0000:01:00.0",
        16376,
        "8.9",
        None,
        "NVIDIA GeForce RTX 4080 SUPER",
    ),
    "tesla-p100-pcie-16gb_510.47.03.csv": (
        None,
        "GPU-ef1b2c9b-38d8-2090-2bd1-f567a3eb42a6",
        None,
        None,
        None,
        None,
        "Tesla P100-PCIE-16GB",
    ),
}


def test_every_query_capture_has_expected_values(realdata: Path) -> None:
    assert sorted(p.name for p in (realdata / "nvidia-smi-query").glob("*.csv")) == sorted(QUERY)


@pytest.mark.parametrize("filename", sorted(QUERY))
def test_query_capture_is_read_exactly(realdata: Path, filename: str) -> None:
    rows = parse_query_csv((realdata / "nvidia-smi-query" / filename).read_text(encoding="utf-8"))
    assert len(rows) == 1
    row = rows[0]
    index, uuid, bus, memory, cap, mig, name = QUERY[filename]
    assert row.get("index") == index
    assert row.get("uuid") == uuid
    assert normalise_bus_id(row.get("pci.bus_id")) == bus
    assert mib_or_none(row.get("memory.total")) == memory
    assert row.get("compute_cap") == cap
    assert row.get("mig.mode.current") == mig
    assert row.get("name") == name


def test_nounits_capture_keeps_numbers_and_drops_na(realdata: Path) -> None:
    row = parse_query_csv((realdata / "nvidia-smi-query/tesla-p100-pcie-16gb_510.47.03.csv").read_text())[0]
    assert row["memory.free"] == "16280", "the header's [MiB] is dropped from the field name"
    assert row["fan.speed"] is None, "[N/A] reads as no value"


def test_headerless_csv_takes_field_names_from_the_caller() -> None:
    rows = parse_query_csv(
        "0, 00000000:01:00.0, 8.6\n1, 00000000:02:00.0, 8.6\n", ["index", "pci.bus_id", "compute_cap"]
    )
    assert [row["compute_cap"] for row in rows] == ["8.6", "8.6"]


def test_ragged_csv_is_an_error() -> None:
    with pytest.raises(SmiParseError, match="row 1 has 2 values for 3 fields"):
        parse_query_csv("index, uuid, compute_cap\n0, GPU-1\n")


def _mig(index: int, profile: str) -> ListedMig:
    return ListedMig(index, profile, f"MIG-{index:08d}-0000-0000-0000-{index:012d}")


# file: (name, [MIG devices])
LISTS = {
    "h100-80gb-hbm3-mig_590.48.01.txt": (
        "NVIDIA H100 80GB HBM3",
        [_mig(0, "3g.40gb"), _mig(1, "2g.20gb"), _mig(2, "1g.10gb"), _mig(3, "1g.10gb")],
    ),
    "h100-80gb-hbm3_590.48.01.txt": ("NVIDIA H100 80GB HBM3", []),
    "h200-mig_590.48.01.txt": (
        "NVIDIA H200",
        [
            _mig(0, "1c.3g.71gb"),
            _mig(1, "2c.3g.71gb"),
            _mig(2, "2g.35gb"),
            _mig(3, "1g.18gb"),
            _mig(4, "1g.18gb"),
        ],
    ),
    "h200_590.48.01.txt": ("NVIDIA H200", []),
    "l40s_595.80.txt": ("NVIDIA L40S", []),
    "rtx-2080-super-windows_610.62.txt": ("NVIDIA GeForce RTX 2080 SUPER", []),
    "rtx-4080-super_595.71.05.txt": ("NVIDIA GeForce RTX 4080 SUPER", []),
}


def test_every_list_capture_has_expected_values(realdata: Path) -> None:
    assert sorted(p.name for p in (realdata / "nvidia-smi-L").iterdir()) == sorted(LISTS)


@pytest.mark.parametrize("filename", sorted(LISTS))
def test_list_capture_is_read_exactly(realdata: Path, filename: str) -> None:
    gpus = parse_list((realdata / "nvidia-smi-L" / filename).read_text(encoding="utf-8"))
    name, migs = LISTS[filename]
    assert len(gpus) == 1
    assert (gpus[0].index, gpus[0].name, gpus[0].uuid) == (0, name, ZERO_GPU)
    assert list(gpus[0].migs) == migs


def test_list_reads_the_r450_mig_form_without_profile() -> None:
    text = (
        "GPU 0: Graphics Device (UUID: GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5)\n"
        "  MIG Device 0: (UUID: MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0)\n"
    )
    gpu = parse_list(text)[0]
    assert gpu.migs == (ListedMig(0, None, "MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/1/0"),)


def test_list_line_of_unknown_shape_is_an_error() -> None:
    with pytest.raises(SmiParseError, match="line 1"):
        parse_list("No devices were found... or something else\n")
