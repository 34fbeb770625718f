"""CDI spec files: strict schema, version gates, loading YAML/JSON, atomic validated writes."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rediacc_core.cdi import (
    KNOWN_VERSIONS,
    CdiSpecError,
    Spec,
    device_nodes,
    dump_spec,
    load_spec,
    validate_spec,
    write_spec,
)
from rediacc_core.cdi.spec import BUILDKIT_AUTOALLOW, autoallowed_specs
from rediacc_core.errors import EXIT_VALIDATION, NotFoundError, ValidationError

SpecFactory = Callable[..., dict[str, Any]]
GPU0_UUID = "GPU-4b0e3c7a-9d21-5f6e-8a13-2c7d90e1f5ab"


def problems_of(document: Any) -> str:
    with pytest.raises(CdiSpecError) as caught:
        validate_spec(document, "test-source.yaml")
    return caught.value.what


# --- loading ---------------------------------------------------------------------------------


def test_a_generated_yaml_spec_loads_with_its_kind_version_and_devices(tmp_path: Path, ctk_yaml: str) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(ctk_yaml)
    spec = load_spec(path)
    assert spec.path == path
    assert spec.version == "0.5.0"
    assert spec.kind == "nvidia.com/gpu"
    assert spec.device_names == ("0", GPU0_UUID, "0:1", spec.device_names[3], "all")
    assert spec.qualified_names()[0] == "nvidia.com/gpu=0"
    assert "nvidia.com/gpu=0:1" in spec.qualified_names()


def test_the_same_spec_as_json_loads_identically(tmp_path: Path, ctk_doc: dict[str, Any]) -> None:
    path = tmp_path / "nvidia.json"
    path.write_text(json.dumps(ctk_doc))
    spec = load_spec(path)
    assert spec.raw == ctk_doc
    assert spec.device_names[0] == "0"


def test_device_nodes_are_the_spec_level_nodes_then_the_devices_own(tmp_path: Path, ctk_yaml: str) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(ctk_yaml)
    nodes = [node["path"] for node in device_nodes(load_spec(path), "0:1")]
    assert nodes == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia0",
        "/dev/nvidia-caps/nvidia-cap12",
        "/dev/nvidia-caps/nvidia-cap13",
    ]


def test_device_nodes_of_a_device_the_spec_does_not_define_is_not_found(make_spec: SpecFactory) -> None:
    spec = validate_spec(make_spec("0"), "x.yaml")
    with pytest.raises(NotFoundError, match=r"nvidia.com/gpu=7 is not defined"):
        device_nodes(spec, "7")


def test_a_spec_without_spec_level_edits_gives_only_the_device_nodes(make_spec: SpecFactory) -> None:
    document = make_spec("0")
    del document["containerEdits"]
    assert device_nodes(validate_spec(document, "x.yaml"), "0") == [{"path": "/dev/nvidia0"}]


@pytest.mark.parametrize("name", ["nvidia.yml", "nvidia.txt", "nvidia"])
def test_only_yaml_and_json_names_are_spec_files(tmp_path: Path, name: str, make_spec: SpecFactory) -> None:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(make_spec("0")))
    with pytest.raises(CdiSpecError, match=r"ends in \.yaml or \.json"):
        load_spec(path)


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(CdiSpecError, match=r"missing\.yaml: cannot read it"):
        load_spec(tmp_path / "missing.yaml")


def test_broken_yaml_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("cdiVersion: 0.5.0\nkind: [unclosed\n")
    with pytest.raises(CdiSpecError) as caught:
        load_spec(path)
    assert str(path) in caught.value.what
    assert "not valid YAML (line 3" in caught.value.what


def test_broken_json_is_reported_with_its_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"cdiVersion": "0.5.0",\n "kind": }')
    with pytest.raises(CdiSpecError, match=r"not valid JSON \(line 2, column 10"):
        load_spec(path)


def test_an_empty_file_is_an_empty_document(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("")
    with pytest.raises(CdiSpecError, match=r"at \$: the document is empty"):
        load_spec(path)


def test_a_repeated_yaml_key_is_refused_because_readers_disagree_on_it(tmp_path: Path, ctk_yaml: str) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        ctk_yaml.replace("kind: nvidia.com/gpu\n", "kind: nvidia.com/gpu\nkind: other.example/gpu\n")
    )
    with pytest.raises(CdiSpecError, match=r'duplicate key "kind"'):
        load_spec(path)


def test_a_repeated_json_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"cdiVersion": "0.5.0", "cdiVersion": "0.6.0", "kind": "a/b", "devices": []}')
    with pytest.raises(CdiSpecError, match=r'duplicate key "cdiVersion"'):
        load_spec(path)


def test_yaml_merge_keys_and_non_string_keys_are_refused(tmp_path: Path) -> None:
    merge = tmp_path / "merge.yaml"
    merge.write_text("base: &b {cdiVersion: 0.5.0}\n<<: *b\n")
    with pytest.raises(CdiSpecError, match=r"merge keys"):
        load_spec(merge)
    numeric = tmp_path / "numeric.yaml"
    numeric.write_text("cdiVersion: 0.5.0\n1: x\n")
    with pytest.raises(CdiSpecError, match=r"mapping key 1 is not a string"):
        load_spec(numeric)


def test_a_spec_error_is_a_validation_error_naming_the_file_and_json_path(
    tmp_path: Path, ctk_yaml: str
) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(ctk_yaml.replace("NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES"))
    with pytest.raises(ValidationError) as caught:
        load_spec(path)
    assert caught.value.exit_code == EXIT_VALIDATION
    assert caught.value.what == (
        f'invalid CDI spec {path}: at $.containerEdits.env[0]: "NVIDIA_VISIBLE_DEVICES" is not KEY=VALUE'
    )
    assert str(path) in caught.value.todo


# --- schema ----------------------------------------------------------------------------------


def test_every_known_version_is_accepted_for_a_plain_spec(make_spec: SpecFactory) -> None:
    assert KNOWN_VERSIONS == ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
    for version in KNOWN_VERSIONS:
        assert validate_spec(make_spec("gpu0", version=version), "x").version == version


@pytest.mark.parametrize("version", ["0.2.0", "0.9.0", "1.2.0", "v0.5.0", "0.5", ""])
def test_an_unknown_cdi_version_is_refused_listing_the_known_ones(
    make_spec: SpecFactory, version: str
) -> None:
    what = problems_of(make_spec("gpu0", version=version))
    assert f'at $.cdiVersion: "{version}" is not a known CDI version' in what
    assert "0.3.0, 0.4.0" in what


def test_a_yaml_number_where_a_string_belongs_is_refused_with_advice_to_quote_it(
    tmp_path: Path, ctk_yaml: str
) -> None:
    path = tmp_path / "n.yaml"
    path.write_text(ctk_yaml.replace("cdiVersion: 0.5.0", "cdiVersion: 1.0").replace('name: "0"', "name: 0"))
    with pytest.raises(CdiSpecError) as caught:
        load_spec(path)
    assert 'at $.cdiVersion: 1.0 is a number, not a string; quote it ("1.0")' in caught.value.what
    assert 'at $.devices[0].name: 0 is a number, not a string; quote it ("0")' in caught.value.what


@pytest.mark.parametrize(
    ("where", "mutate"),
    [
        ("$", lambda d: d.update(containerRuntime=["docker"])),
        ("$.devices[0]", lambda d: d["devices"][0].update(nameShort=["g0"])),
        ("$.containerEdits", lambda d: d["containerEdits"].update(devices=[])),
        (
            "$.containerEdits.deviceNodes[0]",
            lambda d: d["containerEdits"]["deviceNodes"][0].update(hostpath="/x"),
        ),
        (
            "$.containerEdits.hooks[0]",
            lambda d: d["containerEdits"].update(
                hooks=[{"hookName": "poststop", "path": "/bin/x", "timeOut": 3}]
            ),
        ),
        (
            "$.containerEdits.mounts[0]",
            lambda d: d["containerEdits"].update(
                mounts=[{"hostPath": "/a", "containerPath": "/b", "readonly": True}]
            ),
        ),
    ],
)
def test_unknown_fields_are_refused_everywhere(
    make_spec: SpecFactory, where: str, mutate: Callable[..., None]
) -> None:
    document = make_spec("gpu0")
    mutate(document)
    what = problems_of(document)
    assert f"at {where}: unknown field" in what
    assert "known fields:" in what


def test_all_unknown_and_all_missing_fields_of_an_object_are_named_at_once(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["mounts"] = [{"options": ["ro"], "source": "/a", "target": "/b"}]
    what = problems_of(document)
    assert 'at $.containerEdits.mounts[0]: unknown fields "source", "target"' in what
    assert 'at $.containerEdits.mounts[0]: missing required fields "hostPath", "containerPath"' in what
    assert what.count("missing required") == 1


def test_an_unknown_field_error_lists_the_known_ones_to_catch_typos(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["deviceNodes"][0]["premissions"] = "rw"
    assert 'unknown field "premissions" (known fields: fileMode, gid, hostPath, major, minor, path, ' in (
        problems_of(document)
    )


@pytest.mark.parametrize("entry", ["NO_EQUALS", "=value", ""])
def test_env_entries_must_be_key_equals_value(make_spec: SpecFactory, entry: str) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["env"].append(entry)
    assert f"at $.containerEdits.env[1]: {json.dumps(entry)} is not KEY=VALUE" in problems_of(document)


@pytest.mark.parametrize("entry", ["A=", "A==b", "PATH=/usr/bin:/bin", "MULTI=line1\nline2"])
def test_env_values_may_be_empty_or_hold_any_text(make_spec: SpecFactory, entry: str) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["env"].append(entry)
    validate_spec(document, "x")


def test_hook_env_entries_must_be_key_equals_value_too(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["hooks"] = [
        {"hookName": "createContainer", "path": "/bin/h", "env": ["DEBUG"]}
    ]
    assert 'at $.containerEdits.hooks[0].env[0]: "DEBUG" is not KEY=VALUE' in problems_of(document)


# As the reference loader reads them: any of r, w, m (repeats and "" included), or `none`.
@pytest.mark.parametrize("permissions", ["r", "rw", "rwm", "mwr", "m", "", "rr", "none"])
def test_device_permissions_are_letters_from_rwm(make_spec: SpecFactory, permissions: str) -> None:
    document = make_spec("gpu0")
    document["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = permissions
    validate_spec(document, "x")


@pytest.mark.parametrize("permissions", ["rwx", "RW", "r w", "rw\n", "nonE"])
def test_other_device_permissions_are_refused(make_spec: SpecFactory, permissions: str) -> None:
    document = make_spec("gpu0")
    document["devices"][0]["containerEdits"]["deviceNodes"][0]["permissions"] = permissions
    assert (
        f"at $.devices[0].containerEdits.deviceNodes[0].permissions: {json.dumps(permissions)} "
        "is not device permissions" in problems_of(document)
    )


@pytest.mark.parametrize(
    "hook", ["prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"]
)
def test_the_six_oci_hook_names_are_accepted(make_spec: SpecFactory, hook: str) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["hooks"] = [
        {"hookName": hook, "path": "/usr/bin/hook", "args": ["hook"], "timeout": 5}
    ]
    validate_spec(document, "x")


@pytest.mark.parametrize("hook", ["prestrat", "CreateContainer", "createcontainer", "preStop"])
def test_any_other_hook_name_is_refused_listing_the_valid_ones(make_spec: SpecFactory, hook: str) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["hooks"] = [{"hookName": hook, "path": "/usr/bin/hook"}]
    what = problems_of(document)
    assert f'at $.containerEdits.hooks[0].hookName: "{hook}" is not a hook name' in what
    assert "prestart, createRuntime, createContainer, startContainer, poststart, poststop" in what


def test_a_hook_needs_an_absolute_path_and_a_positive_timeout(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["hooks"] = [{"hookName": "poststop", "path": "hook", "timeout": 0}]
    what = problems_of(document)
    assert 'at $.containerEdits.hooks[0].path: "hook" is not an absolute path' in what
    assert "at $.containerEdits.hooks[0].timeout: 0 is less than the minimum of 1" in what


def test_a_device_node_needs_an_absolute_path(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["devices"][0]["containerEdits"]["deviceNodes"] = [{"path": "dev/nvidia0"}, {"type": "c"}]
    what = problems_of(document)
    assert 'at $.devices[0].containerEdits.deviceNodes[0].path: "dev/nvidia0" is not an absolute path' in what
    assert 'at $.devices[0].containerEdits.deviceNodes[1]: missing required field "path"' in what


def test_a_device_node_type_is_one_of_b_c_u_p(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["deviceNodes"][0]["type"] = "x"
    assert '.deviceNodes[0].type: "x" is not a device type (b, c, u or p)' in problems_of(document)


def test_device_node_numbers_are_non_negative_integers(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    node = document["containerEdits"]["deviceNodes"][0]
    node.update(major=-1, minor="255", uid=True, fileMode=438, gid=0)
    what = problems_of(document)
    assert ".deviceNodes[0].major: -1 is less than the minimum of 0" in what
    assert ".deviceNodes[0].minor: '255' is not of type 'integer'" in what
    assert ".deviceNodes[0].uid: True is not of type 'integer'" in what


def test_a_mount_needs_host_and_container_paths(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["mounts"] = [{"hostPath": "/usr/lib/libcuda.so"}]
    assert 'at $.containerEdits.mounts[0]: missing required field "containerPath"' in problems_of(document)


def test_a_net_device_needs_both_names(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0", version="1.1.0")
    document["containerEdits"]["netDevices"] = [{"hostInterfaceName": "eth1"}]
    assert 'at $.containerEdits.netDevices[0]: missing required field "name"' in problems_of(document)


def test_an_intel_rdt_clos_id_is_one_path_component(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0", version="0.7.0")
    document["containerEdits"]["intelRdt"] = {"closID": "../escape"}
    assert 'at $.containerEdits.intelRdt.closID: "../escape" is not a CLOS id' in problems_of(document)


def test_a_spec_must_define_at_least_one_device(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["devices"] = []
    assert "at $.devices: a spec must define at least one device" in problems_of(document)


@pytest.mark.parametrize("edits", [{}, {"env": []}, {"deviceNodes": [], "mounts": []}])
def test_a_device_whose_edits_change_nothing_is_refused(
    make_spec: SpecFactory, edits: dict[str, Any]
) -> None:
    document = make_spec("gpu0")
    document["devices"][0]["containerEdits"] = edits
    assert "at $.devices[0].containerEdits: a device needs at least one container edit" in problems_of(
        document
    )


def test_a_device_without_container_edits_is_refused(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    del document["devices"][0]["containerEdits"]
    assert 'at $.devices[0]: missing required field "containerEdits"' in problems_of(document)


def test_a_device_name_defined_twice_in_one_spec_is_refused(make_spec: SpecFactory) -> None:
    document = make_spec("0", "1", "0")
    assert 'at $.devices[2].name: duplicate device name "0" (already defined at $.devices[0])' in problems_of(
        document
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("gpu=0", "contains '='"),
        ("-gpu", "must start with a letter or digit"),
        ("gpu.", "must end with a letter or digit"),
        ("", "must not be empty"),
    ],
)
def test_a_device_name_is_checked_by_the_device_name_rule(
    make_spec: SpecFactory, name: str, why: str
) -> None:
    assert f'at $.devices[0].name: device name "{name}" {why}' in problems_of(make_spec(name))


@pytest.mark.parametrize(
    ("kind", "why"),
    [
        ("nvidia.com", "must be vendor/class"),
        ("1nvidia.com/gpu", 'vendor "1nvidia.com" must start with a letter'),
        ("nvidia.com/gpu/x", "class \"gpu/x\" contains '/'"),
        ("nvidia.com/", 'class "" must not be empty'),
    ],
)
def test_the_kind_must_be_vendor_slash_class(make_spec: SpecFactory, kind: str, why: str) -> None:
    assert f'at $.kind: kind "{kind}" {why}' in problems_of(make_spec("gpu0", kind=kind))


def test_annotation_values_are_strings_and_keys_look_like_labels(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0", version="0.6.0")
    document["annotations"] = {"rediacc.io/owner": "plugin", "bad key": "x", "count": 3}
    what = problems_of(document)
    assert 'at $.annotations: "bad key" is not an annotation key' in what
    assert 'at $.annotations.count: 3 is a number, not a string; quote it ("3")' in what


def test_validate_spec_accepts_tuples_and_keeps_its_own_copy(make_spec: SpecFactory) -> None:
    document = make_spec("0", "1")
    document["devices"] = tuple(document["devices"])
    document["containerEdits"]["env"] = ("A=1",)
    spec = validate_spec(document, "plugin test")
    document["kind"] = "changed.example/gpu"
    assert spec.raw["kind"] == "nvidia.com/gpu"
    assert spec.raw["containerEdits"]["env"] == ["A=1"]
    assert hash(spec) == hash(validate_spec(make_spec("0", "1"), "plugin test"))


def test_a_deeply_nested_document_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(
        '{"cdiVersion": "0.5.0", "kind": "a/b", "devices": ' + "[" * 100_000 + "]" * 100_000 + "}"
    )
    with pytest.raises(CdiSpecError, match=r"deep\.json"):
        load_spec(path)


def test_a_document_that_is_not_a_mapping_is_refused() -> None:
    assert "at $: the document is a list, not a mapping" in problems_of([])
    assert "at $: the document is empty" in problems_of(None)


def test_many_problems_are_summarised_with_a_count(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0")
    document["containerEdits"]["env"] = [f"BAD{i}" for i in range(12)]
    with pytest.raises(CdiSpecError) as caught:
        validate_spec(document, "x")
    assert len(caught.value.problems) == 12
    assert caught.value.what.endswith("and 4 more")


# --- version gates ---------------------------------------------------------------------------


def _mount_type(d: dict[str, Any]) -> str:
    d["containerEdits"]["mounts"] = [{"hostPath": "/a", "containerPath": "/a", "type": "bind"}]
    return "$.containerEdits.mounts[0].type"


def _host_path(d: dict[str, Any]) -> str:
    d["devices"][0]["containerEdits"]["deviceNodes"][0]["hostPath"] = "/srv/root/dev/nvidia0"
    return "$.devices[0].containerEdits.deviceNodes[0].hostPath"


def _digit_name(d: dict[str, Any]) -> str:
    d["devices"][0]["name"] = "0"
    return "$.devices[0].name"


def _spec_annotations(d: dict[str, Any]) -> str:
    d["annotations"] = {"owner": "rediacc"}
    return "$.annotations"


def _device_annotations(d: dict[str, Any]) -> str:
    d["devices"][0]["annotations"] = {"owner": "rediacc"}
    return "$.devices[0].annotations"


def _dotted_class(d: dict[str, Any]) -> str:
    d["kind"] = "vendor.example/gpu.v2"
    return "$.kind"


def _intel_rdt(d: dict[str, Any]) -> str:
    d["devices"][0]["containerEdits"]["intelRdt"] = {"closID": "gpu"}
    return "$.devices[0].containerEdits.intelRdt"


def _additional_gids(d: dict[str, Any]) -> str:
    d["containerEdits"]["additionalGids"] = [44, 109]
    return "$.containerEdits.additionalGids"


def _net_devices(d: dict[str, Any]) -> str:
    d["devices"][0]["containerEdits"]["netDevices"] = [{"hostInterfaceName": "eth1", "name": "net0"}]
    return "$.devices[0].containerEdits.netDevices"


def _rdt_schemata(d: dict[str, Any]) -> str:
    d["containerEdits"]["intelRdt"] = {"schemata": ["L3:0=ff"]}
    return "$.containerEdits.intelRdt.schemata"


GATES = [
    (_mount_type, "0.4.0"),
    (_host_path, "0.5.0"),
    (_digit_name, "0.5.0"),
    (_spec_annotations, "0.6.0"),
    (_device_annotations, "0.6.0"),
    (_dotted_class, "0.6.0"),
    (_intel_rdt, "0.7.0"),
    (_additional_gids, "0.7.0"),
    (_net_devices, "1.1.0"),
    (_rdt_schemata, "1.1.0"),
]


def _previous(version: str) -> str:
    return KNOWN_VERSIONS[KNOWN_VERSIONS.index(version) - 1]


@pytest.mark.parametrize(("use", "minimum"), GATES, ids=[g[0].__name__.strip("_") for g in GATES])
def test_a_feature_is_refused_below_the_version_that_introduced_it(
    make_spec: SpecFactory, use: Callable[[dict[str, Any]], str], minimum: str
) -> None:
    declared = _previous(minimum)
    document = make_spec("gpu0", version=declared, kind="vendor.example/gpu")
    where = use(document)
    what = problems_of(document)
    assert f"at {where}: " in what
    assert f"needs cdiVersion {minimum} or later, but the spec says {declared}" in what
    assert f'at $.cdiVersion: raise it to "{minimum}"' in what


@pytest.mark.parametrize(("use", "minimum"), GATES, ids=[g[0].__name__.strip("_") for g in GATES])
def test_a_feature_is_accepted_from_the_version_that_introduced_it(
    make_spec: SpecFactory, use: Callable[[dict[str, Any]], str], minimum: str
) -> None:
    for version in KNOWN_VERSIONS[KNOWN_VERSIONS.index(minimum) :]:
        document = make_spec("gpu0", version=version, kind="vendor.example/gpu")
        use(document)
        validate_spec(document, "x")


def test_an_empty_optional_field_does_not_count_as_using_it(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0", version="0.3.0")
    document["annotations"] = {}
    document["containerEdits"]["additionalGids"] = []
    document["containerEdits"]["mounts"] = [{"hostPath": "/a", "containerPath": "/a", "type": ""}]
    validate_spec(document, "x")


def test_the_version_advice_names_the_newest_version_any_feature_needs(make_spec: SpecFactory) -> None:
    document = make_spec("gpu0", version="0.3.0")
    _mount_type(document)
    _additional_gids(document)
    what = problems_of(document)
    assert "mounts[].type needs cdiVersion 0.4.0" in what
    assert "additionalGids needs cdiVersion 0.7.0" in what
    assert 'raise it to "0.7.0"' in what


# --- writing ---------------------------------------------------------------------------------


def test_write_spec_writes_yaml_that_loads_back_identically(tmp_path: Path, ctk_doc: dict[str, Any]) -> None:
    path = tmp_path / "etc" / "cdi" / "nvidia.yaml"
    written = write_spec(path, ctk_doc)
    assert isinstance(written, Spec)
    assert written.path == path
    assert load_spec(path).raw == ctk_doc
    assert path.read_text().startswith("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\n")
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_write_spec_writes_json_for_a_json_name(tmp_path: Path, make_spec: SpecFactory) -> None:
    path = tmp_path / "rediacc-dri.json"
    document = make_spec("renderD128", kind="rediacc.io/dri")
    write_spec(path, document)
    assert json.loads(path.read_text()) == document


def test_an_invalid_document_never_replaces_a_good_spec(
    tmp_path: Path, ctk_yaml: str, ctk_doc: dict[str, Any]
) -> None:
    path = tmp_path / "nvidia.yaml"
    path.write_text(ctk_yaml)
    before = path.stat()
    ctk_doc["containerEdits"]["hooks"][0]["hookName"] = "beforeStart"
    with pytest.raises(CdiSpecError) as caught:
        write_spec(path, ctk_doc)
    assert "nothing was written" in caught.value.todo
    assert path.read_text() == ctk_yaml
    assert path.stat().st_ino == before.st_ino
    assert sorted(os.listdir(tmp_path)) == ["nvidia.yaml"]


def test_write_spec_refuses_a_name_the_loader_would_ignore(tmp_path: Path, make_spec: SpecFactory) -> None:
    with pytest.raises(CdiSpecError, match=r"ends in \.yaml or \.json"):
        write_spec(tmp_path / "nvidia.yml", make_spec("0"))
    assert not (tmp_path / "nvidia.yml").exists()


def test_write_spec_replaces_an_existing_spec_atomically(tmp_path: Path, make_spec: SpecFactory) -> None:
    path = tmp_path / "nvidia.yaml"
    write_spec(path, make_spec("0"))
    write_spec(path, make_spec("0", "1"))
    assert load_spec(path).device_names == ("0", "1")
    assert sorted(os.listdir(tmp_path)) == ["nvidia.yaml"]


def test_dump_spec_chooses_the_format_from_the_file_name(make_spec: SpecFactory) -> None:
    document = make_spec("0")
    assert json.loads(dump_spec(document, Path("x.json"))) == document
    assert yaml.safe_load(dump_spec(document, Path("x.yaml"))) == document
    # Device names that look like numbers stay strings in YAML, or the spec would change meaning.
    assert "name: '0'" in dump_spec(document, Path("x.yaml"))


# --- BuildKit's auto-allow annotation ----------------------------------------------------------


@pytest.mark.parametrize("where", ["spec", "device"])
def test_buildkits_auto_allow_annotation_is_refused_wherever_it_sits(
    make_spec: SpecFactory, where: str
) -> None:
    """Engine 28's BuildKit hands a device so annotated to every build step, no entitlement asked."""
    document = make_spec("0", version="0.6.0")
    holder = document if where == "spec" else document["devices"][0]
    holder["annotations"] = {BUILDKIT_AUTOALLOW: "true"}
    said = problems_of(document)
    assert f"{BUILDKIT_AUTOALLOW} is refused" in said and "remove the annotation" in said


def test_rdc_repo_up_finds_the_spec_files_buildkit_would_auto_allow(
    tmp_path: Path, make_spec: SpecFactory
) -> None:
    document = make_spec("0", version="0.6.0")
    document["annotations"] = {BUILDKIT_AUTOALLOW: "1"}
    (tmp_path / "vendor.yaml").write_text(yaml.safe_dump(document))
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(make_spec("1")))
    (found,) = autoallowed_specs(tmp_path)
    assert found.startswith(f"{tmp_path / 'vendor.yaml'}: at $.annotations")
