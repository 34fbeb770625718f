"""A rule's finding: a refusal about one value (its `subject`, so a plugin's refusal of the same
value can replace it)."""

from __future__ import annotations

from dataclasses import dataclass

from rediacc_core.model import Refusal


@dataclass(frozen=True)
class Finding:
    refusal: Refusal

    @property
    def subject(self) -> str:
        return self.refusal.subject


def refuse(rule: str, subject: str, message: str, replacement: str | None) -> Finding:
    return Finding(Refusal(message=message, replacement=replacement, rule=rule, subject=subject))
