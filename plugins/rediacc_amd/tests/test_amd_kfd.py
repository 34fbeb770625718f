"""The KFD topology parser reads every stored real capture correctly."""

from __future__ import annotations

from pathlib import Path

from rediacc_amd.kfd import (
    AmdGpu,
    gfx_target,
    gpus_from_nodes,
    pci_address,
    read_properties,
    read_topology,
)
from rediacc_amd.testing import kfd_capture_dir


def gpus_of(capture: str) -> list[AmdGpu]:
    return gpus_from_nodes(read_topology(kfd_capture_dir(capture)))


def test_mi25_one_gpu_behind_one_cpu_node() -> None:
    nodes = read_topology(kfd_capture_dir("mi25-vega10-1gpu"))
    assert [(n.node, n.gpu_id, n.is_gpu) for n in nodes] == [(0, 0, False), (1, 13261, True)]

    [gpu] = gpus_from_nodes(nodes)

    assert gpu.index == 0 and gpu.node == 1 and gpu.gpu_id == 13261
    assert gpu.render_minor == 128
    assert gpu.pci_bus_id == "0000:19:00.0"  # location_id 6400 = 0x1900; no `domain` line here
    assert gpu.partition is None
    assert gpu.device_id == 0x6860
    assert gpu.gfx_target is None  # this kernel had no gfx_target_version
    assert gpu.name == "AMD Radeon Instinct MI25"  # the `name` file is an empty line
    assert gpu.memory_mib == 17163091968 // 2**20 == 16368  # mem_banks/0, heap_type 1


def test_mi210_eight_cards_numbered_by_pci_address() -> None:
    gpus = gpus_of("mi210-x8-xgmi")
    # No gpu_id files in this capture: CPU nodes are told apart by simd_count 0.
    assert len(gpus) == 8
    assert [g.pci_bus_id for g in gpus] == [
        "0000:03:00.0",
        "0000:26:00.0",
        "0000:43:00.0",
        "0000:63:00.0",
        "0000:83:00.0",
        "0000:a3:00.0",
        "0000:c3:00.0",
        "0000:e3:00.0",
    ]
    assert [g.render_minor for g in gpus] == [130, 131, 129, 128, 134, 135, 133, 132]
    assert [g.node for g in gpus] == [4, 5, 3, 2, 8, 9, 7, 6]
    assert [g.index for g in gpus] == list(range(8))
    assert {g.name for g in gpus} == {"AMD Instinct MI210"}
    assert {g.gfx_target for g in gpus} == {"gfx90a"}
    assert {g.partition for g in gpus} == {None}
    assert {g.gpu_id for g in gpus} == {None}
    assert {g.memory_mib for g in gpus} == {None}  # no mem_banks, local_mem_size 0


def test_mi300x_cpx_partitions_are_gpus_sharing_their_card_address() -> None:
    gpus = gpus_of("mi300x-cpx")
    assert len(gpus) == 63  # 8 cards x 8 partitions, one partition absent from the capture
    cards: dict[str, list[int]] = {}
    for gpu in gpus:
        assert gpu.partition is not None
        cards.setdefault(gpu.pci_bus_id, []).append(gpu.partition)
    assert list(cards) == [
        "0000:05:00.0",
        "0000:27:00.0",
        "0000:47:00.0",
        "0000:65:00.0",
        "0000:85:00.0",
        "0000:a7:00.0",
        "0000:c7:00.0",
        "0000:e5:00.0",
    ]
    assert all(parts == list(range(8)) for bdf, parts in cards.items() if bdf != "0000:e5:00.0")
    assert cards["0000:e5:00.0"] == list(range(7))
    assert [g.render_minor for g in gpus] == list(range(128, 191))
    first, last = gpus[0], gpus[-1]
    assert (first.index, first.node, first.partition, first.render_minor) == (0, 2, 0, 128)
    assert (last.index, last.node, last.partition, last.render_minor) == (62, 64, 6, 190)
    assert first.name == "AMD Instinct MI300X (partition 0)" and first.gfx_target == "gfx942"
    assert first.unique_id == 16404946649897475633
    assert {g.memory_mib for g in gpus} == {None}  # properties only in this capture


def test_mi308x_cpx_four_partitions_per_card_on_two_pci_domains() -> None:
    gpus = gpus_of("mi308x-cpx")
    assert len(gpus) == 32
    assert sorted({g.pci_bus_id for g in gpus}) == [
        "0000:0a:00.0",
        "0000:80:00.0",
        "0000:a4:00.0",
        "0000:c8:00.0",
        "0001:0b:00.0",
        "0001:81:00.0",
        "0001:a5:00.0",
        "0001:c9:00.0",
    ]
    assert [g.partition for g in gpus] == [0, 1, 2, 3] * 8
    assert [g.render_minor for g in gpus[:8]] == [128, 129, 130, 131, 136, 137, 138, 139]
    assert [g.render_minor for g in gpus[-4:]] == [184, 185, 186, 187]
    assert gpus[16].pci_bus_id == "0001:0b:00.0" and gpus[16].node == 18  # domain 1
    assert gpus[0].gpu_id == 24248 and gpus[0].node == 2
    assert gpus[0].name == "AMD Instinct MI308X (partition 0)"  # `name` says only "ip discovery"
    assert {g.gfx_target for g in gpus} == {"gfx942"}
    # 48 GiB per partition; the last partition of each card is 16 MiB short.
    assert [g.memory_mib for g in gpus[:4]] == [49152, 49152, 49152, 49136]


def test_properties_tolerate_odd_lines() -> None:
    text = "simd_count 80\n\nlocation_id  2560 \nbroken\nname two words\nunique_id 17466021589395472075\n"
    assert read_properties(text) == {"simd_count": 80, "location_id": 2560, "unique_id": 17466021589395472075}


def test_location_id_and_gfx_target_decoding() -> None:
    assert pci_address(0, 25344) == "0000:63:00.0"
    assert pci_address(1, (0xC9 << 8) | (0x1F << 3) | 7) == "0001:c9:1f.7"
    assert gfx_target(90010) == "gfx90a"
    assert gfx_target(90402) == "gfx942"
    assert gfx_target(110001) == "gfx1101"
    assert gfx_target(0) is None and gfx_target(None) is None


def test_gpu_nodes_without_a_render_node_are_skipped(tmp_path: Path) -> None:
    node = tmp_path / "nodes" / "1"
    node.mkdir(parents=True)
    (node / "gpu_id").write_text("4242\n")
    (node / "properties").write_text("simd_count 80\nlocation_id 2560\ndrm_render_minor 0\n")
    nodes = read_topology(tmp_path)
    assert [n.is_gpu for n in nodes] == [True]
    assert gpus_from_nodes(nodes) == []


def test_a_missing_topology_is_no_nodes(tmp_path: Path) -> None:
    assert read_topology(tmp_path / "absent") == []
