"""`rediacc-dri.yaml`: one `rediacc.io/dri` device per render node, mapping that node only."""

from __future__ import annotations

import os

import pytest
from rediacc_dri.discovery import discover
from rediacc_dri.spec import cdi_specs, spec_document
from rediacc_dri.testing import add_render_node, drm_capture_dir, install_drm_capture, intel_igpu

from rediacc_core import Gpu, SetupContext
from rediacc_core.cdi.spec import validate_spec
from rediacc_core.plugins import load_plugins
from rediacc_core.testing import FakeMachine


def _ctx(fm: FakeMachine) -> SetupContext:
    return SetupContext(fm.machine, tuple(discover(fm.machine)), {})


def test_intel_igpu_spec_maps_its_render_node(fake_machine: FakeMachine) -> None:
    intel_igpu(fake_machine)

    [spec_file] = cdi_specs(_ctx(fake_machine))

    assert spec_file.filename == "rediacc-dri.yaml" and spec_file.command is None
    assert spec_file.spec == {
        "cdiVersion": "0.5.0",
        "kind": "rediacc.io/dri",
        "devices": [
            {
                "name": "renderD128",
                "containerEdits": {
                    "deviceNodes": [
                        {
                            "path": "/dev/dri/renderD128",
                            "hostPath": str(fake_machine.path("/dev/dri/renderD128")),
                            "type": "c",
                            "major": 226,
                            "minor": 128,
                        }
                    ]
                },
            }
        ],
    }
    spec = validate_spec(spec_file.spec, "rediacc-dri.yaml")
    assert spec.qualified_names() == ["rediacc.io/dri=renderD128"]


def test_every_render_node_of_the_real_capture_is_a_device(fake_machine: FakeMachine) -> None:
    install_drm_capture(fake_machine, drm_capture_dir())
    [spec_file] = cdi_specs(_ctx(fake_machine))
    spec = validate_spec(spec_file.spec, "rediacc-dri.yaml")
    assert spec.qualified_names() == ["rediacc.io/dri=renderD128", "rediacc.io/dri=renderD129"]
    # Only the render node: the primary node (card<M>) would give display control too.
    paths = [n["path"] for d in spec.raw["devices"] for n in d["containerEdits"]["deviceNodes"]]
    assert paths == ["/dev/dri/renderD128", "/dev/dri/renderD129"]


def test_without_render_nodes_the_owned_file_is_removed(fake_machine: FakeMachine) -> None:
    [spec_file] = cdi_specs(_ctx(fake_machine))
    assert spec_file.filename == "rediacc-dri.yaml"
    assert spec_file.spec is None and spec_file.command is None  # the core removes it


def test_a_node_missing_from_dev_is_left_out(fake_machine: FakeMachine) -> None:
    intel_igpu(fake_machine)
    add_render_node(fake_machine, 129, "0000:03:00.0", 0x1002, 0x740F, "amdgpu")
    fake_machine.path("/dev/dri/renderD128").unlink()
    document = spec_document(fake_machine.machine, [128, 129])
    assert document is not None
    assert [d["name"] for d in document["devices"]] == ["renderD129"]
    fake_machine.path("/dev/dri/renderD129").unlink()
    assert spec_document(fake_machine.machine, [128, 129]) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs mknod for a real device node")
def test_numbers_come_from_the_host_node_itself(fake_machine: FakeMachine) -> None:
    intel_igpu(fake_machine)
    # A node whose numbers differ from sysfs's record: the node is what the runtime will open.
    fake_machine.char_device("/dev/dri/renderD128", 226, 200)
    document = spec_document(fake_machine.machine, [128])
    assert document is not None
    node = document["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert (node["major"], node["minor"]) == (226, 200)


def test_stand_in_node_without_mknod_uses_the_sysfs_record(fake_machine: FakeMachine) -> None:
    intel_igpu(fake_machine)
    node_path = fake_machine.path("/dev/dri/renderD128")
    node_path.unlink()
    node_path.write_text("")  # what FakeMachine leaves when it may not mknod
    document = spec_document(fake_machine.machine, [128])
    assert document is not None
    node = document["devices"][0]["containerEdits"]["deviceNodes"][0]
    assert (node["type"], node["major"], node["minor"]) == ("c", 226, 128)


def test_hooks_through_the_plugin_manager(fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "dri")
    intel_igpu(fake_machine)
    plugins = load_plugins()
    assert plugins.names() == ["dri"]
    info = plugins.infos[0]
    assert set(info.hooks) == {"rdc_discover", "rdc_cdi_specs", "rdc_hardware_units", "rdc_request_rules"}

    gpus = plugins.discover(fake_machine.machine)  # rdc_discover
    specs = plugins.cdi_specs(SetupContext(fake_machine.machine, tuple(gpus), {}))  # rdc_cdi_specs

    assert [g.cdi_names for g in gpus] == [("rediacc.io/dri=renderD128",)]
    assert [s.filename for s in specs] == ["rediacc-dri.yaml"]
    assert validate_spec(specs[0].spec, "rediacc-dri.yaml").device_names == ("renderD128",)


def test_spec_ignores_gpus_other_plugins_found(fake_machine: FakeMachine) -> None:
    other = Gpu(vendor="example", source="example", name="x", attributes={"renderMinor": 128})
    intel_igpu(fake_machine)
    [spec_file] = cdi_specs(SetupContext(fake_machine.machine, (other,), {}))
    assert spec_file.spec is None
