"""Qualified CDI device names: `vendor/class=device`, parsed and checked by the CDI rules.

Each check returns the first thing wrong with one part of the name, so an error can say exactly
which part is bad and why instead of "invalid name".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rediacc_core.errors import ValidationError

EXPECTED_FORM = "vendor/class=device, e.g. vendor.example/gpu=0"

# The CDI rules, as whole-string patterns; the helpers below explain a failed match.
VENDOR_PATTERN = r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"
CLASS_PATTERN = VENDOR_PATTERN
DEVICE_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"

_VENDOR_RE = re.compile(VENDOR_PATTERN)
_DEVICE_RE = re.compile(DEVICE_PATTERN)
_LABEL_PUNCT = "_.-"
_DEVICE_PUNCT = "_.:-"


class CdiNameError(ValidationError):
    """A string that is not a well-formed qualified CDI name; the message names the bad part."""

    def __init__(self, what: str, todo: str = "") -> None:
        super().__init__(what, todo or f"write the device as {EXPECTED_FORM}")


@dataclass(frozen=True)
class QualifiedName:
    """A parsed `vendor/class=name`. `cls` because `class` is a keyword."""

    vendor: str
    cls: str
    name: str

    @property
    def kind(self) -> str:
        """`vendor/class`, the `kind` of the spec that defines this device."""
        return f"{self.vendor}/{self.cls}"

    def __str__(self) -> str:
        return f"{self.vendor}/{self.cls}={self.name}"


def _allowed(punct: str) -> str:
    return "letters, digits and " + ", ".join(f"'{c}'" for c in punct)


def _label_problem(text: str) -> str | None:
    """Why `text` is not a valid vendor or class label, or None when it is."""
    if _VENDOR_RE.fullmatch(text):
        return None
    if not text:
        return "must not be empty"
    if not (text[0].isascii() and text[0].isalpha()):
        return "must start with a letter"
    for char in text:
        if not (char.isascii() and char.isalnum()) and char not in _LABEL_PUNCT:
            return f"contains {char!r}; allowed are {_allowed(_LABEL_PUNCT)}"
    return "must end with a letter or digit"


def device_name_problem(text: str) -> str | None:
    """Why `text` is not a valid device name (the part after `=`), or None when it is."""
    if _DEVICE_RE.fullmatch(text):
        return None
    if not text:
        return "must not be empty"
    if not (text[0].isascii() and text[0].isalnum()):
        return "must start with a letter or digit"
    for char in text:
        if not (char.isascii() and char.isalnum()) and char not in _DEVICE_PUNCT:
            return f"contains {char!r}; allowed are {_allowed(_DEVICE_PUNCT)}"
    return "must end with a letter or digit"


def kind_problem(kind: str) -> str | None:
    """Why `kind` is not a valid `vendor/class`, or None when it is."""
    vendor, slash, cls = kind.partition("/")
    if not slash:
        return "must be vendor/class, e.g. vendor.example/gpu"
    if problem := _label_problem(vendor):
        return f"vendor {_quote(vendor)} {problem}"
    if problem := _label_problem(cls):
        return f"class {_quote(cls)} {problem}"
    return None


def _quote(text: str) -> str:
    # Double quotes as in the examples operators see in docs; json-style escaping keeps odd
    # characters (newlines, quotes) visible in one line.
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def validate_vendor(text: str) -> None:
    if problem := _label_problem(text):
        raise CdiNameError(f"invalid vendor {_quote(text)}: {problem}")


def validate_class(text: str) -> None:
    if problem := _label_problem(text):
        raise CdiNameError(f"invalid class {_quote(text)}: {problem}")


def validate_device_name(text: str) -> None:
    if problem := device_name_problem(text):
        raise CdiNameError(f"invalid device name {_quote(text)}: {problem}")


def parse_qualified_name(text: str) -> QualifiedName:
    """Split and check `vendor/class=name`; CdiNameError names the part that is wrong.

    Split like the reference parser: the first `=` ends the kind, the first `/` in the kind ends the
    vendor, so `a/b/c=d` has class `b/c` (refused for its `/`) rather than vendor `a/b`.
    """
    shown = _quote(text)
    if not text:
        raise CdiNameError(f"an empty string is not a CDI name (expected {EXPECTED_FORM})")
    if text.startswith("/"):
        raise CdiNameError(
            f"{shown} is a path, not a CDI name (expected vendor/class=device)",
            f"use the qualified CDI name of the device ({EXPECTED_FORM}), not its path",
        )
    kind, eq, name = text.partition("=")
    if not eq:
        raise CdiNameError(f'invalid CDI name {shown}: missing "=" before the device name')
    vendor, slash, cls = kind.partition("/")
    if not slash:
        raise CdiNameError(f'invalid CDI name {shown}: missing "/" between vendor and class')
    if not vendor:
        raise CdiNameError(f"invalid CDI name {shown}: empty vendor")
    if not cls:
        raise CdiNameError(f"invalid CDI name {shown}: empty class")
    if not name:
        raise CdiNameError(f"invalid CDI name {shown}: empty device name")
    if problem := _label_problem(vendor):
        raise CdiNameError(f"invalid vendor {_quote(vendor)} in {shown}: {problem}")
    if problem := _label_problem(cls):
        raise CdiNameError(f"invalid class {_quote(cls)} in {shown}: {problem}")
    if problem := device_name_problem(name):
        raise CdiNameError(f"invalid device name {_quote(name)} in {shown}: {problem}")
    return QualifiedName(vendor, cls, name)


def is_qualified_name(text: str) -> bool:
    """True when `text` is a well-formed qualified name (never for "" or a path)."""
    try:
        parse_qualified_name(text)
    except CdiNameError:
        return False
    return True
