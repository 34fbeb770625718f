"""`GET /info` as a tenant sees it: the machine's CDI devices cut to the repo's grants."""

from __future__ import annotations

import json

import pytest

from rediacc_core.gate.policy.views import info_body, info_for_repo

DEVICES = [
    {"Source": "cdi", "ID": "vendor.example/gpu=0"},
    {"Source": "cdi", "ID": "vendor.example/gpu=1"},
    {"Source": "cdi", "ID": "vendor.example/gpu=all"},
    {"Source": "other", "ID": "vendor.example/gpu=0"},  # a source the gate does not know: not shown
]


@pytest.mark.parametrize(
    ("granted", "shown"),
    [
        (set(), []),
        ({"vendor.example/gpu=0"}, ["vendor.example/gpu=0"]),
        (
            {"vendor.example/gpu=1", "vendor.example/gpu=all"},
            ["vendor.example/gpu=1", "vendor.example/gpu=all"],
        ),
        ({"vendor.example/tpu=0"}, []),  # a grant the daemon does not list stays unlisted
    ],
)
def test_only_the_granted_cdi_devices_are_listed(granted: set[str], shown: list[str]) -> None:
    document = {"ID": "x", "Containers": 3, "DiscoveredDevices": DEVICES, "CDISpecDirs": ["/etc/cdi"]}
    seen = info_for_repo(document, granted)
    assert [d["ID"] for d in seen["DiscoveredDevices"]] == shown
    assert {k: v for k, v in seen.items() if k != "DiscoveredDevices"} == {
        "ID": "x",
        "Containers": 3,
        "CDISpecDirs": ["/etc/cdi"],
    }


def test_an_older_daemons_info_is_sent_as_it_came() -> None:
    document = {"ID": "x", "Driver": "overlay2"}  # API < 1.50: no DiscoveredDevices
    assert info_for_repo(document, {"vendor.example/gpu=0"}) == document


def test_the_body_is_json_and_a_non_json_answer_is_an_error() -> None:
    body = info_body(json.dumps({"DiscoveredDevices": DEVICES}).encode(), {"vendor.example/gpu=0"})
    assert json.loads(body) == {"DiscoveredDevices": [DEVICES[0]]}
    with pytest.raises(ValueError):
        info_body(b"<html>", set())
