"""The answers the gate makes itself: a read route with a `view` (`GET /info`) is asked of the
repo's daemon, and what the daemon answers is sent as the route's view lets this repo see it (for
`/info`, its CDI devices cut to the repo's grants: `policy/views.py`)."""

from __future__ import annotations

import http.client
from collections.abc import Callable
from pathlib import Path

from rediacc_core import unixhttp
from rediacc_core.blocking import may_block
from rediacc_core.gate.decide.decision import Answer, Decision, Forward, Refuse
from rediacc_core.gate.policy.endpoints import Route
from rediacc_core.gate.policy.views import seen_through

ANSWER_TIMEOUT = 30.0


def answer(
    upstream: Path | None, route: Route, raw_target: str, granted: Callable[[], frozenset[str]]
) -> Decision:
    """`route`'s answer as this repo may see it: asked of the daemon, seen through `route.view`."""
    if upstream is None or route.view is None:
        return Forward()  # no daemon behind this decider (unit tests of other routes)
    may_block()
    where = f"{route.method} {route.pattern}"
    try:
        status, raw = unixhttp.request(upstream, route.method, raw_target, timeout=ANSWER_TIMEOUT)
    except (OSError, http.client.HTTPException) as exc:
        return Refuse(502, f"the repo's daemon did not answer {where}: {exc}", endpoint=route.name)
    if status != 200:
        return Forward(endpoint=route.name)  # its error, as the daemon phrases it
    try:
        return Answer(seen_through(route.view, raw, granted()), endpoint=route.name)
    except ValueError:
        return Refuse(502, f"the repo's daemon answered {where} with no JSON", endpoint=route.name)
