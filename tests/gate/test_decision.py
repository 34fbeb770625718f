"""A decision is one of three (forward, refuse, answer), each with the fields the audit trail writes;
core and plugin refusals are merged on `(rule, subject)`, never by reading a message."""

from __future__ import annotations

import dataclasses

import pytest

from rediacc_core.gate.decide.decision import Answer, Decision, Forward, Refuse, merge_refusals, refuse
from rediacc_core.gate.policy.findings import refuse as finding
from rediacc_core.model import Refusal

AUDITED = ("status", "endpoint", "rules", "cdi_asked", "cdi_admitted", "message", "log")


@pytest.mark.parametrize(
    ("decision", "audited"),
    [
        (
            Forward(
                body=b"{}", endpoint="container-create", cdi_asked=("v/gpu=0",), cdi_admitted=("v/gpu=0",)
            ),
            (200, "container-create", (), ("v/gpu=0",), ("v/gpu=0",), "", ()),
        ),
        (
            refuse("POST /containers/create", [Refusal("no", rule="grant")], endpoint="container-create"),
            (403, "container-create", ("grant",), (), (), "no", ("403 POST /containers/create: no",)),
        ),
        (Answer(b"{}", endpoint="info"), (200, "info", (), (), (), "", ())),
    ],
)
def test_every_decision_carries_the_audit_fields(decision: Decision, audited: tuple[object, ...]) -> None:
    assert tuple(getattr(decision, name) for name in AUDITED) == audited


def test_a_decision_is_frozen_and_only_a_forward_forwards() -> None:
    decisions: list[Decision] = [Forward(), Refuse(400, "bad"), Answer(b"{}")]
    assert [d.forward for d in decisions] == [True, False, False]
    with pytest.raises(dataclasses.FrozenInstanceError):
        decisions[1].message = "changed"  # type: ignore[misc]


CORE = [
    finding(
        "raw-device", "/dev/acme0", "raw device /dev/acme0 is refused", "--device <vendor>/<class>=<name>"
    ),
    finding("raw-device", "/dev/sda", "raw device /dev/sda is refused", "--device <vendor>/<class>=<name>"),
    finding("privileged", "Privileged", "privileged containers are refused", None),
]


def test_a_plugin_refusal_replaces_the_cores_with_the_same_rule_and_subject() -> None:
    theirs = Refusal("ACME card 0", "--device acme.example/gpu=0", rule="raw-device", subject="/dev/acme0")
    assert merge_refusals(CORE, [theirs]) == [CORE[1].refusal, CORE[2].refusal, theirs]


def test_a_plugin_message_naming_another_value_does_not_replace_it() -> None:
    theirs = Refusal("raw device /dev/sda is refused too", rule="raw-device", subject="/dev/acme0")
    assert merge_refusals(CORE, [theirs]) == [CORE[1].refusal, CORE[2].refusal, theirs]


def test_a_plugin_refusal_without_a_subject_replaces_its_whole_rule() -> None:
    theirs = Refusal("raw device /dev/acme0 is refused", "--device acme.example/gpu=0", rule="raw-device")
    assert merge_refusals(CORE, [theirs]) == [CORE[2].refusal, theirs]


def test_a_plugin_refusal_of_a_rule_of_its_own_stands_beside_the_cores() -> None:
    theirs = Refusal("unsatisfied condition", rule="acme-require", subject="/dev/acme0")
    untagged = Refusal("no rule id")
    assert merge_refusals(CORE, [theirs, untagged]) == [f.refusal for f in CORE] + [theirs, untagged]
