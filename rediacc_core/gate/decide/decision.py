"""A decision of the gate, and how refusals become its text.

A decision is one of three, and only these: `Forward` (send the request upstream), `Refuse` (answer
with an error and why) or `Answer` (the gate answers 200 itself, `views`). Each carries the fields
the audit trail writes (`status`, `endpoint`, `rules`, `cdi_asked`, `cdi_admitted`, `message`) and
the lines for the gate's log, typed: those a variant cannot have are constants of its class (a
forward has no refusing rule). The exchange and the audit read them as they are, never by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rediacc_core.gate.policy.findings import Finding
from rediacc_core.model import Refusal


@dataclass(frozen=True, kw_only=True)
class Forward:
    """Send the request upstream: `body` (the canonical re-encoded body) in place of the original
    when set, else the body as it came."""

    forward: ClassVar[bool] = True
    status: ClassVar[int] = 200
    message: ClassVar[str] = ""
    rules: ClassVar[tuple[str, ...]] = ()
    body: bytes | None = None
    log: tuple[str, ...] = ()  # lines for the gate's log
    endpoint: str = ""  # the route's name, for the audit trail and the metrics
    cdi_asked: tuple[str, ...] = ()  # the CDI names the request named
    cdi_admitted: tuple[str, ...] = ()  # those it is forwarded with (rewrites may add names)


@dataclass(frozen=True)
class Refuse:
    """Answer `status` with `message` (Docker's {"message": ...} JSON); nothing is forwarded."""

    forward: ClassVar[bool] = False
    cdi_admitted: ClassVar[tuple[str, ...]] = ()
    status: int  # 400 or 403 for a refused request; 5xx when the gate could not decide
    message: str
    log: tuple[str, ...] = ()
    endpoint: str = ""
    rules: tuple[str, ...] = ()  # the refusing rules' ids
    cdi_asked: tuple[str, ...] = ()
    refusals: tuple[Refusal, ...] = ()  # each problem apart, for a caller that shows them (`rdc repo check`)


@dataclass(frozen=True)
class Answer:
    """Not forwarded: the gate answers 200 with this JSON itself (`views`)."""

    forward: ClassVar[bool] = False
    status: ClassVar[int] = 200
    message: ClassVar[str] = ""
    rules: ClassVar[tuple[str, ...]] = ()
    cdi_asked: ClassVar[tuple[str, ...]] = ()
    cdi_admitted: ClassVar[tuple[str, ...]] = ()
    answer: bytes
    log: tuple[str, ...] = ()
    endpoint: str = ""


Decision = Forward | Refuse | Answer


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
) -> Refuse:
    """The refusal of the request at `where`, every problem on a line of its own."""
    status = 403 if any(r.status == 403 for r in refusals) else 400
    # One problem per line: the docker CLI prints the message as it is.
    message = "\n".join(describe(r) for r in refusals)
    rule_ids = tuple(dict.fromkeys(r.rule for r in refusals if r.rule))
    return Refuse(
        status,
        message,
        log=(*(log or []), f"{status} {where}: {message}"),
        endpoint=endpoint,
        rules=rule_ids,
        cdi_asked=cdi,
        refusals=tuple(refusals),
    )
