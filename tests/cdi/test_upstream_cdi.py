"""The CDI library agrees with the reference implementation's own test vectors.

The vectors live in `tests/cdi/upstream/*.yaml`, copied as data (inputs and expected results) from
container-device-interface's test suite; each file says where from. `loader_agreement.yaml` adds the
inputs where Python and the reference Go code could read a spec differently. Deliberate differences
are listed in docs/upstream.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rediacc_core.cdi.names import CdiNameError, is_qualified_name, parse_qualified_name
from rediacc_core.cdi.registry import Registry
from rediacc_core.cdi.spec import KNOWN_VERSIONS, CdiSpecError, parse_spec_text, validate_spec

VECTORS = Path(__file__).parent / "upstream"


def vectors(name: str) -> list[dict[str, Any]]:
    loaded: list[dict[str, Any]] = yaml.safe_load((VECTORS / name).read_text(encoding="utf-8"))
    return loaded


def cases(name: str, key: str = "name") -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", vectors(name), ids=[str(v[key]) for v in vectors(name)])


def accepted(text: str) -> bool:
    try:
        validate_spec(parse_spec_text(text, "yaml", "<vector>"), "<vector>")
    except CdiSpecError:
        return False
    return True


# --- parser ---------------------------------------------------------------------------------------


@cases("qualified_names.yaml", key="device")
def test_qualified_names_parse_as_upstream_parses_them(case: dict[str, Any]) -> None:
    assert is_qualified_name(case["device"]) is bool(case.get("qualified"))
    if case.get("qualified"):
        parsed = parse_qualified_name(case["device"])
        assert (parsed.vendor, parsed.cls, parsed.name) == (case["vendor"], case["class"], case["name"])
        assert str(parsed) == case["device"]
    else:
        with pytest.raises(CdiNameError):
            parse_qualified_name(case["device"])


# --- spec validation ------------------------------------------------------------------------------


@cases("specs.yaml")
def test_specs_are_accepted_exactly_when_upstream_accepts_them(case: dict[str, Any]) -> None:
    assert accepted(case["text"]) is case["valid"]


@cases("loader_agreement.yaml")
def test_specs_python_could_read_differently_are_read_as_the_daemons_loader_reads_them(
    case: dict[str, Any],
) -> None:
    assert accepted(case["text"]) is case["valid"]


@cases("container_edits.yaml")
def test_container_edits_are_accepted_exactly_when_upstream_accepts_them(case: dict[str, Any]) -> None:
    document: dict[str, Any] = {
        "cdiVersion": KNOWN_VERSIONS[-1],
        "kind": "vendor.com/device",
        "devices": [{"name": "dev", "containerEdits": {"env": ["DEV=1"]}}],
    }
    if case["edits"] is not None:
        document["containerEdits"] = case["edits"]
    try:
        validate_spec(document, "<vector>")
    except CdiSpecError as exc:
        assert not case["valid"], exc.what
    else:
        assert case["valid"], "accepted, upstream refuses it"


def _completed(fragment: dict[str, Any], version: str) -> dict[str, Any]:
    return {
        "cdiVersion": version,
        "kind": "vendor.com/device",
        "devices": [{"name": "dev", "containerEdits": {"env": ["DEV=1"]}}],
        **fragment,
    }


@cases("required_versions.yaml")
def test_each_feature_needs_the_cdi_version_upstream_says(case: dict[str, Any]) -> None:
    needed = case["version"]
    validate_spec(_completed(case["spec"], needed), "<vector>")
    older = KNOWN_VERSIONS[: KNOWN_VERSIONS.index(needed)]
    if older:
        with pytest.raises(CdiSpecError, match=f"needs cdiVersion {needed} or later"):
            validate_spec(_completed(case["spec"], older[-1]), "<vector>")


# --- the cache: which file a device resolves to -----------------------------------------------------


@cases("cache.yaml")
def test_devices_resolve_to_the_files_upstream_resolves_them_to(case: dict[str, Any], tmp_path: Path) -> None:
    dirs = [tmp_path / "etc", tmp_path / "run"]
    for directory in dirs:
        directory.mkdir()
        for filename, text in case[directory.name].items():
            (directory / filename).write_text(text, encoding="utf-8")

    registry = Registry.load(dirs)

    sources = {
        name: str(entry.spec.path.relative_to(tmp_path))
        for name, entry in registry.devices.items()
        if entry.spec.path is not None
    }
    assert sources == case["sources"]
    in_error = {str(path.relative_to(tmp_path)) for paths in registry.conflicts.values() for path in paths}
    assert in_error == set(case["errors"])
    assert registry.errors == []
