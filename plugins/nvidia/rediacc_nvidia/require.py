"""The `NVIDIA_REQUIRE_*` expression language, evaluated against one GPU's facts.

A container's environment may hold any number of `NVIDIA_REQUIRE_<X>` variables; each must hold.
Within one value, terms separated by spaces are alternatives (OR) and terms joined by commas must
all hold (AND): `cuda>=12.2 brand=tesla,driver>=470,driver<471` reads "CUDA 12.2, or a Tesla on a
470 driver". A term is `<key><op><value>` with keys `cuda`, `driver`, `arch`, `brand` (any case) and
operators `= != < <= > >=`; `brand` takes only `=` and `!=`. Versions compare numerically, dot by
dot, with missing parts as 0 (`470` == `470.0.0`, `12.10` > `12.9`). As in the NVIDIA Container
Toolkit, a term with another key is ignored, empty terms (a stray comma, two spaces) are skipped,
and `NVIDIA_REQUIRE_JETPACK*` (Jetson mount options, not requirements) is not read.

A fact the inventory lacks (an old driver reports no compute capability) makes a term unknown
rather than false: unknown results never refuse a request, they are logged by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

PREFIX = "NVIDIA_REQUIRE_"
JETPACK = "NVIDIA_REQUIRE_JETPACK"  # and _HOST_MOUNTS: options for Jetson's CSV mounts
DISABLE = "NVIDIA_DISABLE_REQUIRE"
KEYS = ("cuda", "driver", "arch", "brand")
OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
CUDA_ADVICE = "please update your driver to a newer version, or use an earlier cuda container"

_TERM = re.compile(r"^([A-Za-z]+)(>=|<=|!=|=|<|>)([^=<>!]+)$")
_VERSION = re.compile(r"^\d+(\.\d+)*$")

# nvidia-smi prints vGPU brands in full; CUDA images use the short, space-free spellings.
_BRAND_ALIASES = {
    "nvidiavirtualapplications": "vapps",
    "nvidiavirtualpc": "vpc",
    "nvidiavirtualcomputeserver": "vcs",
    "nvidiavirtualworkstation": "vws",
    "nvidiartxvirtualworkstation": "vws",
    "nvidiacloudgaming": "cloudgaming",
}


class RequirementError(ValueError):
    """A malformed expression; the message names the variable and the term."""


@dataclass(frozen=True)
class Term:
    key: str  # lower case
    op: str
    value: str
    text: str  # as written, for messages

    @property
    def wants_newer_cuda(self) -> bool:
        return self.key == "cuda" and self.op in (">=", ">")


@dataclass(frozen=True)
class Requirement:
    variable: str
    text: str
    alternatives: tuple[tuple[Term, ...], ...]  # OR of ANDs


@dataclass(frozen=True)
class GpuFacts:
    label: str  # e.g. "GPU 0 (NVIDIA A100-SXM4-40GB)"
    cuda: str | None
    driver: str | None
    arch: str | None
    brand: str | None


@dataclass(frozen=True)
class Outcome:
    """`holds` is True, False, or None when a needed fact is unknown. `failed` names a false term."""

    holds: bool | None
    failed: Term | None = None


def parse_bool(text: str) -> bool | None:
    """Go's strconv.ParseBool, which the toolkit uses for NVIDIA_DISABLE_REQUIRE; None if not a bool."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


def parse_term(text: str, variable: str = PREFIX + "*") -> Term | None:
    """The condition `text`; None when empty or for a key this language does not know (ignored, as
    the toolkit ignores them)."""
    if not text.strip():
        return None
    operator_at = next((index for index, char in enumerate(text) if char in "<>=!"), None)
    if operator_at is None:
        raise RequirementError(
            f"{variable}: {text!r} is not a condition; write <key><operator><value>, e.g. cuda>=12.2"
        )
    if text[:operator_at].lower() not in KEYS:
        return None  # whatever follows: the toolkit skips a key it does not know
    match = _TERM.fullmatch(text)
    if match is None:
        raise RequirementError(
            f"{variable}: {text!r} is not a condition; write <key><operator><value>, e.g. cuda>=12.2"
        )
    key, op, value = match.group(1).lower(), match.group(2), match.group(3)
    if key == "brand":
        if op not in ("=", "!="):
            raise RequirementError(
                f"{variable}: {text!r} compares a brand with {op}; brands take only = and !="
            )
    elif _VERSION.match(value) is None:
        raise RequirementError(
            f"{variable}: {text!r} has {value!r}, which is not a version like 12.2 or 535.54.03"
        )
    return Term(key, op, value, text)


def parse_requirement(variable: str, value: str) -> Requirement:
    alternatives = []
    for alternative in value.split():
        terms = [parse_term(part, variable) for part in alternative.split(",") if part]
        known = tuple(term for term in terms if term is not None)
        if known:  # an alternative of ignored terms only is dropped, as upstream drops it
            alternatives.append(known)
    return Requirement(variable, value, tuple(alternatives))


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def compare_versions(left: str, right: str) -> int:
    a, b = _version(left), _version(right)
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def normalise_brand(text: str) -> str:
    squashed = re.sub(r"[\s_-]+", "", text.lower())
    return _BRAND_ALIASES.get(squashed, squashed)


def evaluate_term(term: Term, facts: GpuFacts) -> bool | None:
    fact = {"cuda": facts.cuda, "driver": facts.driver, "arch": facts.arch, "brand": facts.brand}[term.key]
    if fact is None:
        return None
    if term.key == "brand":
        same = normalise_brand(fact) == normalise_brand(term.value)
        return same if term.op == "=" else not same
    if _VERSION.match(fact) is None:
        return None  # an unreadable fact from the inventory: unknown, not a refusal
    order = compare_versions(fact, term.value)
    return {
        "=": order == 0,
        "!=": order != 0,
        "<": order < 0,
        "<=": order <= 0,
        ">": order > 0,
        ">=": order >= 0,
    }[term.op]


def evaluate(requirement: Requirement, facts: GpuFacts) -> Outcome:
    """OR over alternatives of AND over terms, in three-valued logic (unknown facts)."""
    if not requirement.alternatives:
        return Outcome(True)
    unknown = False
    first_failed: Term | None = None
    for alternative in requirement.alternatives:
        failed: Term | None = None
        alternative_unknown = False
        for term in alternative:
            result = evaluate_term(term, facts)
            if result is False:
                failed = term
                break
            if result is None:
                alternative_unknown = True
        if failed is None and not alternative_unknown:
            return Outcome(True)
        if failed is None:
            unknown = True
        elif first_failed is None:
            first_failed = failed
    return Outcome(None) if unknown else Outcome(False, first_failed)


def environment(entries: Iterable[object]) -> dict[str, str]:
    """`KEY=VALUE` entries as a dict, later entries winning (as in Docker); bare `KEY`s are skipped."""
    env: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, str) and "=" in entry:
            key, _, value = entry.partition("=")
            env[key] = value
    return env


def collect(env: Mapping[str, str]) -> list[Requirement]:
    """Every requirement the environment states, with the implicit one of legacy CUDA images.

    Returns [] when NVIDIA_DISABLE_REQUIRE is a true boolean. Raises RequirementError for a
    malformed expression.
    """
    if parse_bool(env.get(DISABLE, "")):
        return []
    requirements = [
        parse_requirement(name, value)
        for name, value in sorted(env.items())
        if name.startswith(PREFIX) and not name.startswith(JETPACK) and value.strip()
    ]
    legacy = env.get("CUDA_VERSION", "")
    if legacy and not env.get(PREFIX + "CUDA"):
        # Images from before NVIDIA_REQUIRE_CUDA existed: the runtime required their CUDA version.
        version = legacy_cuda_version(legacy)
        if version is None:
            raise RequirementError(f"CUDA_VERSION={legacy!r} is not a version like 10.0.130")
        requirements.append(parse_requirement("CUDA_VERSION", f"cuda>={version}"))
    return requirements


_SEMVER = re.compile(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")
_UINT32 = 2**32 - 1


def legacy_cuda_version(text: str) -> str | None:
    """`major.minor` of a CUDA_VERSION as the toolkit reads it (a loose semantic version: `8` is
    8.0, `v11.6` is 11.6, `9.0.116` is 9.0); None when it is not one or a part exceeds 32 bits."""
    match = _SEMVER.fullmatch(text)
    if match is None:
        return None
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    if major > _UINT32 or minor > _UINT32:
        return None
    return f"{major}.{minor}"
