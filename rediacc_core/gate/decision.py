"""A decision of the gate (forward or refuse, and why), and how refusals become its text."""

from __future__ import annotations

from dataclasses import dataclass

from rediacc_core.gate.policy.findings import Finding
from rediacc_core.model import Refusal


@dataclass(frozen=True)
class Decision:
    forward: bool  # True: send upstream
    status: int = 200  # refusal status (400/403) when not forward
    message: str = ""  # refusal text (sent as Docker's {"message": ...} JSON)
    body: bytes | None = None  # canonical re-encoded body to forward instead of the original
    answer: bytes | None = None  # not forwarded: the gate answers 200 with this JSON itself (`views`)
    log: tuple[str, ...] = ()  # lines for the gate's log
    # For the audit trail: the endpoint's name, the refusing rules' ids, the CDI names asked and admitted.
    endpoint: str = ""
    rules: tuple[str, ...] = ()
    cdi_asked: tuple[str, ...] = ()
    cdi_admitted: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()  # each problem apart, for a caller that shows them (`rdc repo check`)


def describe(refusal: Refusal) -> str:
    if refusal.replacement:
        return f"{refusal.message}; use instead: {refusal.replacement}"
    return refusal.message


def merge_refusals(core: list[Finding], plugin: list[Refusal]) -> list[Refusal]:
    """The core's findings, less those a plugin refusal with the same rule id replaces, then the plugins'.

    A plugin refusal replaces the core findings of its rule whose subject (the refused value) it
    mentions; when it mentions none of them, it replaces the whole rule.
    """
    by_rule: dict[str, list[Refusal]] = {}
    for refusal in plugin:
        if refusal.rule:
            by_rule.setdefault(refusal.rule, []).append(refusal)
    kept: list[Refusal] = []
    grouped: dict[str, list[Finding]] = {}
    for finding in core:
        grouped.setdefault(finding.refusal.rule, []).append(finding)
    for rule, findings in grouped.items():
        theirs = by_rule.get(rule)
        if not theirs:
            kept.extend(f.refusal for f in findings)
            continue
        text = " ".join(f"{r.message} {r.replacement or ''}" for r in theirs)
        mentioned = [f for f in findings if f.subject and f.subject in text]
        if mentioned:
            kept.extend(f.refusal for f in findings if f not in mentioned)
    return kept + plugin


def refuse(
    where: str,
    refusals: list[Refusal],
    log: list[str] | None = None,
    *,
    endpoint: str = "",
    cdi: tuple[str, ...] = (),
) -> Decision:
    """The refusal of the request at `where`, every problem on a line of its own."""
    status = 403 if any(r.status == 403 for r in refusals) else 400
    # One problem per line: the docker CLI prints the message as it is.
    message = "\n".join(describe(r) for r in refusals)
    rule_ids = tuple(dict.fromkeys(r.rule for r in refusals if r.rule))
    return Decision(
        False,
        status,
        message,
        log=(*(log or []), f"{status} {where}: {message}"),
        endpoint=endpoint,
        rules=rule_ids,
        cdi_asked=cdi,
        refusals=tuple(refusals),
    )
