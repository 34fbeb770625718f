"""Small readings of values that several floors share."""

from __future__ import annotations


def split_list(value: str) -> list[str]:
    """The items of a comma-separated setting, stripped, empty ones dropped."""
    return [item.strip() for item in value.split(",") if item.strip()]
