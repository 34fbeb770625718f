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
    """The core's findings, less those a plugin refusal replaces, then the plugins' refusals.

    The core's rules are the first stage and the plugins' the second, merged on `(rule, subject)`:
    a plugin refusal replaces the core finding with the same rule id and subject; one with a core
    rule's id and no subject (written before refusals had one) replaces every finding of its rule.
    """
    whole = {r.rule for r in plugin if r.rule and not r.subject}
    each = {(r.rule, r.subject) for r in plugin if r.rule and r.subject}
    kept = [
        f.refusal for f in core if f.refusal.rule not in whole and (f.refusal.rule, f.subject) not in each
    ]
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
