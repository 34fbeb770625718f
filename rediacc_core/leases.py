"""Lease ends for grants: `--for 8h` (a duration from now) or `--until 2026-12-03T08:00Z` (a time).

Stored as rdc's UTC stamps (`YYYY-MM-DDTHH:MM:SSZ`, see `repos.now_iso`), whose text order is their
time order, so "in force" is one string comparison wherever grants are read.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from rediacc_core.errors import ValidationError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+)([smhdw])")
_FOR_HELP = "write a duration as digits and units: 90m, 8h, 1d12h, 2w"


def parse_duration(text: str) -> timedelta:
    """`8h`, `90m`, `1d12h`, `2w` -> a positive timedelta; ValidationError otherwise."""
    cleaned = text.strip().lower()
    parts = _DURATION.findall(cleaned)
    if not parts or "".join(n + u for n, u in parts) != cleaned:
        raise ValidationError(f"--for {text!r} is not a duration", _FOR_HELP)
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ValidationError(f"--for {text!r} is no time at all", _FOR_HELP)
    return timedelta(seconds=seconds)


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """An ISO 8601 time (`2026-12-03T08:00Z`, `2026-12-03 08:00+01:00`); without a zone it is UTC."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValidationError(
            f"--until {text!r} is not a time", "write it as ISO 8601, e.g. 2026-12-03T08:00Z (no zone: UTC)"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def expiry(duration: str | None, until: str | None, now: datetime | None = None) -> str | None:
    """The lease end `--for`/`--until` ask for (at most one of them), None for neither."""
    if duration is not None and until is not None:
        raise ValidationError("--for and --until both say when the grant ends", "give one of them")
    current = now or datetime.now(UTC)
    if duration is not None:
        return stamp(current + parse_duration(duration))
    if until is not None:
        end = parse_time(until)
        if end <= current:
            raise ValidationError(f"--until {until} is already past", "give a time in the future")
        return stamp(end)
    return None
