"""The CDI registry: spec dirs resolved with the daemon's priority and conflict rules."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rediacc_core.cdi import DeviceEntry, Registry, RegistryCache, fingerprint, suggest
from rediacc_core.machine import Machine

SpecFactory = Callable[..., dict[str, Any]]


def put(directory: Path, name: str, document: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    text = json.dumps(document) if name.endswith(".json") else yaml.safe_dump(document, sort_keys=False)
    path.write_text(text)
    return path


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    return tmp_path / "etc" / "cdi"


@pytest.fixture
def var(tmp_path: Path) -> Path:
    return tmp_path / "var" / "run" / "cdi"


def test_every_device_of_every_spec_file_is_registered(etc: Path, make_spec: SpecFactory) -> None:
    gpu = put(etc, "nvidia.yaml", make_spec("0", "1", "all"))
    put(etc, "rediacc-dri.json", make_spec("renderD128", kind="rediacc.io/dri"))
    registry = Registry.load([etc])
    assert registry.names() == frozenset(
        {"nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all", "rediacc.io/dri=renderD128"}
    )
    assert registry.devices["nvidia.com/gpu=1"] == DeviceEntry(registry.specs[0], "1")
    assert registry.devices["nvidia.com/gpu=1"].spec.path == gpu
    assert registry.get("nvidia.com/gpu=all") is not None
    assert registry.get("nvidia.com/gpu=9") is None
    assert registry.errors == []
    assert registry.conflicts == {}


def test_a_later_dir_wins_over_an_earlier_one(etc: Path, var: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yaml", make_spec("0", "1"))
    newer = put(var, "nvidia.yaml", make_spec("0"))
    registry = Registry.load([etc, var])
    assert registry.devices["nvidia.com/gpu=0"].spec.path == newer
    assert registry.devices["nvidia.com/gpu=1"].spec.path == etc / "nvidia.yaml"
    assert registry.conflicts == {}


def test_dir_order_not_name_decides_priority(etc: Path, var: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yaml", make_spec("0"))
    put(var, "nvidia.yaml", make_spec("0"))
    assert Registry.load([var, etc]).devices["nvidia.com/gpu=0"].spec.path == etc / "nvidia.yaml"


def test_the_same_device_twice_in_one_dir_is_a_conflict_and_both_copies_are_dropped(
    etc: Path, make_spec: SpecFactory
) -> None:
    first = put(etc, "a.yaml", make_spec("0", "1"))
    second = put(etc, "b.json", make_spec("0", "2"))
    registry = Registry.load([etc])
    assert "nvidia.com/gpu=0" not in registry.devices
    assert registry.conflicts == {"nvidia.com/gpu=0": [first, second]}
    # The rest of both files stays usable.
    assert {"nvidia.com/gpu=1", "nvidia.com/gpu=2"} <= registry.names()
    assert registry.conflict_messages() == [
        f"nvidia.com/gpu=0 is defined more than once at the same priority ({first}, {second}); "
        "no copy is used"
    ]


def test_a_conflict_lists_every_file_that_defines_the_name(etc: Path, make_spec: SpecFactory) -> None:
    paths = [put(etc, f"{n}.yaml", make_spec("0")) for n in ("a", "b", "c")]
    assert Registry.load([etc]).conflicts == {"nvidia.com/gpu=0": paths}


def test_a_conflict_stays_dropped_even_if_a_later_dir_defines_the_name_again(
    etc: Path, var: Path, make_spec: SpecFactory
) -> None:
    # The daemon's CDI cache behaves this way; the gate must agree with it about what exists.
    put(etc, "a.yaml", make_spec("0"))
    put(etc, "b.yaml", make_spec("0"))
    put(var, "c.yaml", make_spec("0"))
    registry = Registry.load([etc, var])
    assert "nvidia.com/gpu=0" not in registry.devices
    assert list(registry.conflicts) == ["nvidia.com/gpu=0"]


def test_same_device_name_under_different_kinds_is_no_conflict(etc: Path, make_spec: SpecFactory) -> None:
    put(etc, "a.yaml", make_spec("0"))
    put(etc, "b.yaml", make_spec("0", kind="vendor.example/gpu"))
    assert Registry.load([etc]).names() == frozenset({"nvidia.com/gpu=0", "vendor.example/gpu=0"})


def test_only_yaml_and_json_files_are_read_and_yml_is_ignored(etc: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yml", make_spec("0"))
    put(etc, "notes.txt", make_spec("1"))
    (etc / ".nvidia.yaml.1234.tmp").write_text("half-written")
    put(etc / "sub.yaml", "inner.yaml", make_spec("3"))
    put(etc, "real.yaml", make_spec("2"))
    registry = Registry.load([etc])
    assert registry.names() == frozenset({"nvidia.com/gpu=2"})
    assert registry.errors == []


def test_a_broken_file_is_listed_in_errors_and_skipped(etc: Path, make_spec: SpecFactory) -> None:
    broken = etc / "broken.yaml"
    put(etc, "good.yaml", make_spec("0"))
    bad = make_spec("1")
    bad["containerEdits"]["env"] = ["NO_VALUE"]
    put(etc, "broken.yaml", bad)
    (etc / "garbage.json").write_text("{not json")
    registry = Registry.load([etc])
    assert registry.names() == frozenset({"nvidia.com/gpu=0"})
    assert [spec.path for spec in registry.specs] == [etc / "good.yaml"]
    assert len(registry.errors) == 2
    assert registry.errors[0] == (
        f'invalid CDI spec {broken}: at $.containerEdits.env[0]: "NO_VALUE" is not KEY=VALUE'
    )
    assert registry.errors[1].startswith(f"invalid CDI spec {etc / 'garbage.json'}: not valid JSON")


def test_a_missing_dir_is_no_error(tmp_path: Path, etc: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yaml", make_spec("0"))
    registry = Registry.load([tmp_path / "nowhere", etc])
    assert registry.names() == frozenset({"nvidia.com/gpu=0"})
    assert registry.errors == []


def test_a_spec_dir_that_is_a_file_is_an_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "cdi"
    not_a_dir.write_text("")
    registry = Registry.load([not_a_dir])
    assert registry.devices == {}
    assert registry.errors and registry.errors[0].startswith(f"{not_a_dir}: cannot list CDI spec dir")


def test_for_machine_reads_only_etc_cdi_under_the_machine_root(
    tmp_path: Path, make_spec: SpecFactory
) -> None:
    put(tmp_path / "etc" / "cdi", "nvidia.yaml", make_spec("0"))
    put(tmp_path / "var" / "run" / "cdi", "nvidia.yaml", make_spec("1"))
    registry = Registry.for_machine(Machine("m1", root=tmp_path))
    assert registry.dirs == (tmp_path / "etc" / "cdi",)
    assert registry.names() == frozenset({"nvidia.com/gpu=0"})


def test_the_fingerprint_changes_only_when_spec_files_change(etc: Path, make_spec: SpecFactory) -> None:
    path = put(etc, "nvidia.yaml", make_spec("0"))
    start = fingerprint([etc])
    assert Registry.fingerprint([etc]) == start
    assert [row[0] for row in start] == [str(path)]
    put(etc, "ignored.yml", make_spec("1"))
    assert fingerprint([etc]) == start
    put(etc, "more.json", make_spec("2"))
    added = fingerprint([etc])
    assert added != start
    (etc / "more.json").unlink()
    assert fingerprint([etc]) == start
    put(etc, "nvidia.yaml", make_spec("0", "1"))  # rewritten in place: size and mtime change
    assert fingerprint([etc]) != start


def test_the_fingerprint_sees_a_file_replaced_by_rename(etc: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yaml", make_spec("0"))
    start = fingerprint([etc])
    put(etc, "staging.tmp", make_spec("1"))
    os.replace(etc / "staging.tmp", etc / "nvidia.yaml")
    assert fingerprint([etc]) != start


def test_a_registry_remembers_the_fingerprint_it_was_loaded_at(etc: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yaml", make_spec("0"))
    assert Registry.load([etc]).loaded_fingerprint == fingerprint([etc])


def test_the_cache_reloads_only_after_a_spec_file_changed(etc: Path, make_spec: SpecFactory) -> None:
    put(etc, "nvidia.yaml", make_spec("0"))
    cache = RegistryCache([etc])
    first = cache.get()
    assert cache.get() is first
    put(etc, "more.yaml", make_spec("1", kind="vendor.example/gpu"))
    second = cache.get()
    assert second is not first
    assert "vendor.example/gpu=1" in second.names()
    assert cache.get() is second


def test_suggest_offers_the_nearest_defined_names_of_the_same_kind() -> None:
    names = ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all", "rediacc.io/dri=renderD128"]
    assert suggest("nvidia.com/gpu=al", names)[0] == "nvidia.com/gpu=all"
    assert suggest("rediacc.io/dri=renderD129", names) == ["rediacc.io/dri=renderD128"]
    assert suggest("nvidia.con/gpu=0", names)[0] == "nvidia.com/gpu=0"


def test_suggest_offers_nothing_when_nothing_is_close() -> None:
    assert suggest("vendor.example/fpga=primary", ["nvidia.com/gpu=0"]) == []
    assert suggest("x", []) == []
