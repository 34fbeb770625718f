"""A decision tried on the gate's event loop gives way as soon as a rule would ask the daemon.

The real decider and pluggy sit between the gate and the image lookup; the signal must cross
both, even rules that turn their own errors into refusals (`except Exception`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from rediacc_core import ApiRequest, GateContext, Verdict, hookimpl
from rediacc_core.blocking import MustNotBlock, decisions_must_not_block
from rediacc_core.gate.decide.decider import Decider
from rediacc_core.gate.decide.images import ImageConfigs
from rediacc_core.plugins import load_plugins
from rediacc_core.repos import Repo
from rediacc_core.testing.fakemachine import FakeMachine

REPO = Repo("6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11", "alpha", None, "m1", None, "2026-01-01T00:00:00Z")


@dataclass
class AsksForTheImage:
    @hookimpl
    def rdc_request_rules(self, request: ApiRequest, ctx: GateContext) -> list[Verdict]:
        with contextlib.suppress(Exception):  # a careful rule: its own trouble never crashes the gate
            ctx.image_config("bb:latest")
        return []


@pytest.fixture
def decider(fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Decider:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    plugins = load_plugins(extra=[("asks", AsksForTheImage())])
    return Decider(
        fake_machine.machine,
        REPO,
        plugins,
        image_config=ImageConfigs(tmp_path / "no-daemon.sock", timeout=0.5),
        log=lambda line: None,
        grants=lambda repo_id: frozenset(),
    )


BODY = b'{"Image": "bb:latest", "Cmd": ["true"]}'


def test_an_image_lookup_on_the_loop_hands_the_decision_to_a_worker(decider: Decider) -> None:
    with decisions_must_not_block(), pytest.raises(MustNotBlock):
        decider.decide("POST", "/v1.45/containers/create", "application/json", BODY)


def test_in_a_worker_the_same_decision_completes(decider: Decider) -> None:
    decision = decider.decide("POST", "/v1.45/containers/create", "application/json", BODY)
    assert decision.forward
