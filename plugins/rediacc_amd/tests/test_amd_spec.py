"""`rediacc-amd.yaml`: `gpu<N>` is `/dev/kfd` plus that GPU's render node; `all` has every render node."""

from __future__ import annotations

from typing import Any

import pytest
from rediacc_amd.discovery import discover
from rediacc_amd.spec import cdi_specs, spec_document
from rediacc_amd.testing import install_kfd_capture, two_amd_gpus

from rediacc_core import SetupContext
from rediacc_core.cdi.spec import validate_spec
from rediacc_core.plugins import load_plugins
from rediacc_core.testing import FakeMachine


def _ctx(fm: FakeMachine) -> SetupContext:
    return SetupContext(fm.machine, tuple(discover(fm.machine)), {})


def _node(fm: FakeMachine, path: str, major: int, minor: int) -> dict[str, Any]:
    return {"path": path, "hostPath": str(fm.path(path)), "type": "c", "major": major, "minor": minor}


def test_two_gpus_and_all(fake_machine: FakeMachine) -> None:
    two_amd_gpus(fake_machine)

    [spec_file] = cdi_specs(_ctx(fake_machine))

    kfd = _node(fake_machine, "/dev/kfd", 238, 0)
    r128 = _node(fake_machine, "/dev/dri/renderD128", 226, 128)
    r129 = _node(fake_machine, "/dev/dri/renderD129", 226, 129)
    assert spec_file.filename == "rediacc-amd.yaml"
    assert spec_file.spec == {
        "cdiVersion": "0.5.0",
        "kind": "rediacc.io/amd",
        "devices": [
            {"name": "gpu0", "containerEdits": {"deviceNodes": [kfd, r128]}},
            {"name": "gpu1", "containerEdits": {"deviceNodes": [kfd, r129]}},
            {"name": "all", "containerEdits": {"deviceNodes": [kfd, r128, r129]}},
        ],
    }
    spec = validate_spec(spec_file.spec, "rediacc-amd.yaml")
    assert spec.qualified_names() == ["rediacc.io/amd=gpu0", "rediacc.io/amd=gpu1", "rediacc.io/amd=all"]


def test_partitions_of_a_real_capture_each_map_their_own_render_node(fake_machine: FakeMachine) -> None:
    install_kfd_capture(fake_machine, "mi300x-cpx")
    [spec_file] = cdi_specs(_ctx(fake_machine))
    spec = validate_spec(spec_file.spec, "rediacc-amd.yaml")
    assert len(spec.device_names) == 64 and spec.device_names[-1] == "all"
    gpu9 = spec.raw["devices"][9]["containerEdits"]["deviceNodes"]
    assert [n["path"] for n in gpu9] == ["/dev/kfd", "/dev/dri/renderD137"]
    every = spec.raw["devices"][-1]["containerEdits"]["deviceNodes"]
    assert len(every) == 1 + 63


def test_without_amd_gpus_the_owned_file_is_removed(fake_machine: FakeMachine) -> None:
    [spec_file] = cdi_specs(_ctx(fake_machine))
    assert spec_file.filename == "rediacc-amd.yaml" and spec_file.spec is None and spec_file.command is None


def test_a_gpu_whose_render_node_is_gone_is_left_out(fake_machine: FakeMachine) -> None:
    two_amd_gpus(fake_machine)
    fake_machine.path("/dev/dri/renderD128").unlink()
    document = spec_document(fake_machine.machine, [(0, 128), (1, 129)])
    assert document is not None
    assert [d["name"] for d in document["devices"]] == ["gpu1", "all"]
    fake_machine.path("/dev/kfd").unlink()
    assert spec_document(fake_machine.machine, [(0, 128), (1, 129)]) is None


def test_stand_in_nodes_use_the_sysfs_records(fake_machine: FakeMachine) -> None:
    two_amd_gpus(fake_machine)
    for path in ("/dev/kfd", "/dev/dri/renderD128"):
        fake_machine.path(path).unlink()
        fake_machine.path(path).write_text("")  # what FakeMachine leaves when it may not mknod
    document = spec_document(fake_machine.machine, [(0, 128)])
    assert document is not None
    kfd, render = document["devices"][0]["containerEdits"]["deviceNodes"]
    assert (kfd["major"], kfd["minor"], render["major"], render["minor"]) == (238, 0, 226, 128)


def test_specs_through_the_plugin_manager(fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "amd")
    two_amd_gpus(fake_machine)
    plugins = load_plugins()
    ctx = SetupContext(fake_machine.machine, tuple(plugins.discover(fake_machine.machine)), {})
    [spec_file] = plugins.cdi_specs(ctx)  # rdc_cdi_specs
    assert validate_spec(spec_file.spec, spec_file.filename).device_names == ("gpu0", "gpu1", "all")
