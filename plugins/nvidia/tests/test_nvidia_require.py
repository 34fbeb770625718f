"""The NVIDIA_REQUIRE_* expression language: operators, OR/AND, case, versions, malformed input."""

from __future__ import annotations

import pytest
from rediacc_nvidia.require import (
    CUDA_ADVICE,
    GpuFacts,
    RequirementError,
    collect,
    compare_versions,
    environment,
    evaluate,
    parse_bool,
    parse_requirement,
    parse_term,
)

A100 = GpuFacts("GPU 0 (NVIDIA A100)", cuda="12.2", driver="535.54.03", arch="8.0", brand="NVIDIA")
T4 = GpuFacts("GPU 0 (Tesla T4)", cuda="11.7", driver="515.105.01", arch="7.5", brand="Tesla")


def holds(text: str, facts: GpuFacts = A100) -> bool | None:
    return evaluate(parse_requirement("NVIDIA_REQUIRE_TEST", text), facts).holds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cuda=12.2", True),
        ("cuda=12.1", False),
        ("cuda!=12.1", True),
        ("cuda!=12.2", False),
        ("cuda<12.3", True),
        ("cuda<12.2", False),
        ("cuda<=12.2", True),
        ("cuda<=12.1", False),
        ("cuda>12.1", True),
        ("cuda>12.2", False),
        ("cuda>=12.2", True),
        ("cuda>=12.3", False),
    ],
)
def test_every_operator(text: str, expected: bool) -> None:
    assert holds(text) is expected


def test_space_is_or_and_comma_is_and() -> None:
    cuda_image = "cuda>=12.2 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=535,driver<536"
    assert holds(cuda_image, A100) is True, "the first alternative holds"
    assert holds(cuda_image, T4) is False, "T4 on 515: no alternative holds"
    assert holds("cuda>=12.4 brand=nvidia,driver>=535,driver<536", A100) is True, "the AND alternative holds"
    assert holds("cuda>=12.4 brand=nvidia,driver>=536", A100) is False


def test_keys_are_case_insensitive_and_brands_compare_without_case_or_spaces() -> None:
    assert holds("CUDA>=12.0,Driver>=535,ARCH>=8.0") is True
    assert holds("brand=TESLA", T4) is True
    assert holds("brand=nvidiartx", GpuFacts("g", "12.2", "550", "8.6", "NVIDIA RTX")) is True
    assert holds("brand!=geforce", T4) is True
    assert holds("brand!=tesla", T4) is False


def test_versions_compare_numerically_dot_by_dot() -> None:
    assert compare_versions("12.10", "12.9") == 1
    assert compare_versions("470", "470.0.0") == 0
    assert compare_versions("535.54.03", "535.54.3") == 0
    assert compare_versions("535.104.05", "535.54.03") == 1
    assert holds("driver>=535.9", A100) is True, "535.54 is newer than 535.9"
    assert holds("arch>=7.5", T4) is True and holds("arch>7.5", T4) is False


def test_unknown_fact_is_unknown_not_false() -> None:
    old = GpuFacts("GPU 0 (Quadro P400)", cuda="10.1", driver="418.43", arch=None, brand="Quadro")
    assert holds("arch>=6.0", old) is None
    assert holds("arch>=6.0 cuda>=10.0", old) is True, "another alternative holds"
    assert holds("arch>=6.0,cuda>=11.0", old) is False, "a false term decides an AND"


def test_failed_term_is_named() -> None:
    outcome = evaluate(parse_requirement("NVIDIA_REQUIRE_CUDA", "cuda>=12.4 brand=tesla,driver>=470"), A100)
    assert outcome.holds is False
    assert outcome.failed is not None and outcome.failed.text == "cuda>=12.4"
    assert outcome.failed.wants_newer_cuda
    assert "update your driver" in CUDA_ADVICE


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("cuda", "not a condition"),
        ("cuda==12.2", "not a condition"),
        ("cuda=>12.2", "not a condition"),
        ("brand>=tesla", "brands take only = and !="),
        ("cuda>=twelve", "not a version"),
        ("cuda>=12..2", "not a version"),
    ],
)
def test_malformed_expressions_say_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(RequirementError, match=problem) as raised:
        parse_requirement("NVIDIA_REQUIRE_X", text)
    assert "NVIDIA_REQUIRE_X" in str(raised.value)


def test_parse_term_keeps_the_text_for_messages() -> None:
    term = parse_term("Cuda>=11.0")
    assert term is not None
    assert (term.key, term.op, term.value, term.text) == ("cuda", ">=", "11.0", "Cuda>=11.0")


def test_collect_takes_every_require_variable() -> None:
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_ARCH": "arch>=8.0", "PATH": "/bin"}
    assert [r.variable for r in collect(env)] == ["NVIDIA_REQUIRE_ARCH", "NVIDIA_REQUIRE_CUDA"]


def test_legacy_cuda_version_implies_a_requirement() -> None:
    (implied,) = collect({"CUDA_VERSION": "10.0.130"})
    assert implied.alternatives[0][0].text == "cuda>=10.0"
    assert [
        r.variable for r in collect({"CUDA_VERSION": "10.0.130", "NVIDIA_REQUIRE_CUDA": "cuda>=9.0"})
    ] == ["NVIDIA_REQUIRE_CUDA"], "an explicit NVIDIA_REQUIRE_CUDA replaces the implied one"


@pytest.mark.parametrize("value", ["1", "t", "T", "true", "TRUE", "True"])
def test_disable_require_with_any_true_boolean(value: str) -> None:
    assert collect({"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": value}) == []


@pytest.mark.parametrize("value", ["0", "false", "no", "", "yes"])
def test_disable_require_other_values_keep_requirements(value: str) -> None:
    assert len(collect({"NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": value})) == 1


def test_parse_bool_is_go_strconv() -> None:
    assert parse_bool("yes") is None and parse_bool("F") is False


def test_environment_later_entries_win_and_bare_keys_are_skipped() -> None:
    assert environment(["A=1", "B", "A=2", "C=x=y", 5]) == {"A": "2", "C": "x=y"}
