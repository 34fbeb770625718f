"""A rule's finding: a refusal plus the value it is about (so a plugin's refusal of it can replace it)."""

from __future__ import annotations

from dataclasses import dataclass

from rediacc_core.model import Refusal


@dataclass(frozen=True)
class Finding:
    refusal: Refusal
    subject: str


def refuse(rule: str, subject: str, message: str, replacement: str | None) -> Finding:
    return Finding(Refusal(message=message, replacement=replacement, rule=rule), subject)
