"""The NVIDIA plugin reads requirements and visible devices as the NVIDIA Container Toolkit does.

The vectors live in `plugins/nvidia/tests/upstream/*.yaml`, copied as data (inputs and expected
results) from the toolkit's test suite, plus cases read from its code; each file says where from.
Deliberate differences are listed in docs/upstream.md and this plugin's README.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from rediacc_nvidia.require import (
    RequirementError,
    collect,
    environment,
    legacy_cuda_version,
    parse_requirement,
    parse_term,
)
from rediacc_nvidia.visible import legacy_requests

DATA = Path(__file__).parent / "upstream"
REQUIREMENTS = yaml.safe_load((DATA / "requirements.yaml").read_text(encoding="utf-8"))
VISIBLE = yaml.safe_load((DATA / "visible_devices.yaml").read_text(encoding="utf-8"))


def cases(vectors: list[dict[str, Any]], key: str = "name") -> pytest.MarkDecorator:
    return pytest.mark.parametrize("case", vectors, ids=[str(v[key]) for v in vectors])


# --- requirements -----------------------------------------------------------------------------------


@cases(REQUIREMENTS["conditions"])
def test_conditions_parse_as_the_toolkit_parses_them(case: dict[str, Any]) -> None:
    if case["expected"] == "error":
        with pytest.raises(RequirementError):
            parse_term(case["condition"])
        return
    term = parse_term(case["condition"])
    assert (None if term is None else [term.key, term.op, term.value]) == case["expected"]


@cases(REQUIREMENTS["requirements"])
def test_requirements_combine_terms_as_the_toolkit_does(case: dict[str, Any]) -> None:
    if case["expected"] == "error":
        with pytest.raises(RequirementError):
            parse_requirement("NVIDIA_REQUIRE_X", case["requirement"])
        return
    requirement = parse_requirement("NVIDIA_REQUIRE_X", case["requirement"])
    assert [[term.text for term in terms] for terms in requirement.alternatives] == case["expected"]


@cases(REQUIREMENTS["image_requirements"])
def test_an_images_environment_yields_the_toolkits_requirements(case: dict[str, Any]) -> None:
    found = sorted(requirement.text for requirement in collect(environment(case["env"])))
    assert found == sorted(case["requirements"])


@cases(REQUIREMENTS["legacy_versions"], key="version")
def test_legacy_cuda_versions_read_as_the_toolkit_reads_them(case: dict[str, Any]) -> None:
    assert legacy_cuda_version(case["version"]) == case["expected"]
    if case["expected"] is None:
        with pytest.raises(RequirementError, match="CUDA_VERSION"):
            collect({"CUDA_VERSION": case["version"]})


@pytest.mark.parametrize(
    ("value", "alternatives"),
    [
        ("cuda>=12.2,", [["cuda>=12.2"]]),  # a stray comma
        (",cuda>=12.2", [["cuda>=12.2"]]),
        ("cuda>=12.2,,brand=tesla", [["cuda>=12.2", "brand=tesla"]]),
        ("cuda>=12.2  brand=tesla", [["cuda>=12.2"], ["brand=tesla"]]),  # two spaces
        ("gpu>=1", []),  # an unknown key
    ],
)
def test_empty_terms_and_unknown_keys_are_skipped_as_in_the_toolkit(
    value: str, alternatives: list[Any]
) -> None:
    requirement = parse_requirement("NVIDIA_REQUIRE_CUDA", value)
    assert [[term.text for term in terms] for terms in requirement.alternatives] == alternatives


# --- visible devices --------------------------------------------------------------------------------


def read_visible(env: dict[str, str]) -> Any:
    requests = [r for r in legacy_requests(env) if r.variable == "NVIDIA_VISIBLE_DEVICES"]
    if not requests or requests[0].state == "void":
        return "void"
    if requests[0].state == "none":
        return "none"
    return list(requests[0].tokens)


@cases(VISIBLE["vectors"] + VISIBLE["code"])
def test_visible_devices_read_as_the_toolkit_reads_them(case: dict[str, Any]) -> None:
    if case.get("legacy"):
        # The one deliberate difference (docs/upstream.md): under runc an image's CUDA_VERSION alone
        # gets no GPU, so the gate does not read it as a request for every GPU.
        assert read_visible(case["env"]) == "void"
        return
    assert read_visible(case["env"]) == case["expected"]
