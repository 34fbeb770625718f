"""Turning the values NVIDIA's tools print into plain Python values.

nvidia-smi prints `N/A`, `[N/A]`, `Not Supported` or an empty element where a value is unknown, puts
units after numbers (`40960 MiB`) except with `--format=csv,nounits`, and writes PCI bus ids with an
8-digit domain (`00000000:01:00.0`). Everything here is forgiving about those and strict about the rest.
"""

from __future__ import annotations

import re

# Spellings of "no value" seen across driver generations, compared case-insensitively.
_MISSING = frozenset(
    {"", "n/a", "[n/a]", "none", "not supported", "[not supported]", "unknown error", "[unknown error]"}
)

_MIB_PER_UNIT = {"kib": 1 / 1024, "kb": 1 / 1024, "mib": 1.0, "mb": 1.0, "gib": 1024.0, "gb": 1024.0}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)?\s*$")
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def text_or_none(value: str | None) -> str | None:
    """`value` stripped, or None when the tool said it has no value."""
    if value is None:
        return None
    stripped = " ".join(value.split())
    return None if stripped.lower() in _MISSING else stripped


def int_or_none(value: str | None) -> int | None:
    text = text_or_none(value)
    if text is None:
        return None
    try:
        return int(text, 0) if text.lower().startswith("0x") else int(text)
    except ValueError:
        return None


def mib_or_none(value: str | None) -> int | None:
    """Memory in MiB from `40960 MiB`, `16280` (csv nounits) or `80 GiB`; None when unknown."""
    text = text_or_none(value)
    if text is None:
        return None
    match = _MEMORY.match(text)
    if match is None:
        return None
    number = float(match.group(1))
    unit = (match.group(2) or "MiB").lower()
    if unit not in _MIB_PER_UNIT:
        return None
    return round(number * _MIB_PER_UNIT[unit])


def normalise_bus_id(value: str | None) -> str | None:
    """A PCI address as the rest of rediacc writes it: `0000:01:00.0`, lower case, 4-digit domain.

    NVML and nvidia-smi print an 8-digit domain (`00000000:01:00.0`); sysfs prints 4 digits. Domains
    wider than 16 bits (rare, some VMs) keep all their digits so two cards never collapse into one.
    """
    text = text_or_none(value)
    if text is None:
        return None
    match = _BUS_ID.match(text)
    if match is None:
        return None
    domain = int(match.group(1) or "0", 16)
    bus, device, function = int(match.group(2), 16), int(match.group(3), 16), match.group(4)
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def is_bus_id(value: str) -> bool:
    return _BUS_ID.match(value.strip()) is not None


def major_minor(version: str | None) -> str | None:
    """`12.2` from `12.2`, `12.2.140` or `12.02`; None when it does not start with two numbers."""
    text = text_or_none(version)
    if text is None:
        return None
    match = re.match(r"^(\d+)\.(\d+)", text)
    if match is None:
        return None
    return f"{int(match.group(1))}.{int(match.group(2))}"
