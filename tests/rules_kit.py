"""Rule contexts for the core rules on a simulated machine: the repo's files directory as its bind root."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rediacc_core.gate.policy import mounts, rules
from rediacc_core.gate.policy.endpoints import ROUTES, Route
from rediacc_core.gate.policy.findings import Finding
from rediacc_core.gate.policy.pins import Pins
from rediacc_core.repos import files_dir
from rediacc_core.testing.fakemachine import FakeMachine

REPO_ID = "6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11"


def files(fm: FakeMachine) -> str:
    """The repo's files directory as a host path (made if missing)."""
    path = files_dir(fm.machine, REPO_ID)
    path.mkdir(parents=True, exist_ok=True)
    return os.path.realpath(path)


def rule_context(
    fm: FakeMachine,
    *,
    roots: tuple[tuple[str, bool], ...] = (),
    extra_capabilities: frozenset[str] = frozenset(),
    volume_drivers: frozenset[str] = frozenset(),
    query: Mapping[str, tuple[str, ...]] | None = None,
    pins: Pins | None = None,
) -> rules.RuleContext:
    policy = mounts.BindPolicy(
        files_dir=files(fm),
        roots=(mounts.Root(files(fm), False), *(mounts.Root(os.path.realpath(p), ro) for p, ro in roots)),
        never=mounts.never_paths(fm.machine.path),
        volume_drivers=volume_drivers,
        pins=pins,
    )
    return rules.RuleContext("alpha@m1", policy, extra_capabilities, query or {})


def route(endpoint: str) -> Route:
    """The route of the table named `endpoint`: its record says which rule and pinning it gets."""
    return next(r for r in ROUTES if r.name == endpoint)


def check(endpoint: str, body: Any, ctx: rules.RuleContext) -> list[Finding]:
    """Every core finding for a request of `endpoint` with canonical `body`, as the decider asks
    its route for them."""
    return route(endpoint).findings(body, ctx)


def pin(endpoint: str, body: dict[str, Any], ctx: rules.RuleContext) -> list[Finding]:
    """Pin the bind sources of an admitted `body` of `endpoint` as the decider does."""
    pinning = route(endpoint).pin
    return [] if pinning is None else list(pinning.pin(body, ctx))
