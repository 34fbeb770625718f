"""The gate's own answer to `GET /info`: the daemon's, its CDI devices cut to the repo's grants."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rediacc_core.gate.decide.decision import Answer, Decision, Forward, Refuse


def info_answer(upstream: Path | None, raw_target: str, granted: Callable[[], frozenset[str]]) -> Decision:
    """`GET /info` as this repo may see it: asked of the daemon, its CDI devices cut to the grants."""
    from rediacc_core.blocking import may_block
    from rediacc_core.gate.decide import views

    if upstream is None:
        return Forward()  # no daemon behind this decider (unit tests of other routes)
    may_block()
    import http.client

    from rediacc_core import unixhttp

    try:
        status, raw = unixhttp.request(upstream, "GET", raw_target, timeout=30)
    except (OSError, http.client.HTTPException) as exc:
        return Refuse(502, f"the repo's daemon did not answer GET /info: {exc}", endpoint="info")
    if status != 200:
        return Forward(endpoint="info")  # its error, as the daemon phrases it
    try:
        return Answer(views.info_body(raw, granted()), endpoint="info")
    except ValueError:
        return Refuse(502, "the repo's daemon answered GET /info with no JSON", endpoint="info")
