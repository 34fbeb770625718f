"""Which slirp4netns forwards a repo's running containers call for, and how the port keeper gets
there from the forwards that exist."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rediacc_core import unixhttp
from rediacc_core.publishing import Port, policy_from, read_state
from rediacc_core.runtime import ports
from rediacc_core.runtime.ports import Forward, admit, plan, published_ports, wanted

WEB = {"State": "running", "Ports": [{"IP": "0.0.0.0", "PrivatePort": 80, "PublicPort": 8080, "Type": "tcp"}]}


def test_a_port_published_on_every_inside_address_is_forwarded_from_each_allowed_host_address() -> None:
    assert wanted([WEB], ["127.0.0.1", "192.0.2.2"]) == {
        Forward("tcp", "127.0.0.1", 8080),
        Forward("tcp", "192.0.2.2", 8080),
    }


def test_ipv4_and_ipv6_listings_of_one_binding_make_one_forward() -> None:
    both = {"State": "running", "Ports": [*WEB["Ports"], {"IP": "::", "PrivatePort": 80, "PublicPort": 8080}]}
    assert wanted([both], ["127.0.0.1"]) == {Forward("tcp", "127.0.0.1", 8080)}


def test_nothing_is_forwarded_for_stopped_containers_unpublished_or_inside_only_ports() -> None:
    stopped = {**WEB, "State": "exited"}
    exposed = {"State": "running", "Ports": [{"PrivatePort": 80, "Type": "tcp"}]}
    inside = {"State": "running", "Ports": [{"IP": "127.0.0.1", "PrivatePort": 80, "PublicPort": 9090}]}
    sctp = {
        "State": "running",
        "Ports": [{"IP": "0.0.0.0", "PrivatePort": 9, "PublicPort": 9, "Type": "sctp"}],
    }
    assert wanted([stopped, exposed, inside, sctp], ["127.0.0.1"]) == set()


def test_no_allowed_address_publishes_nothing() -> None:
    assert wanted([WEB], []) == set()


def test_the_plan_adds_what_is_missing_and_removes_what_no_container_publishes() -> None:
    keep, stale, new = (
        Forward("tcp", "127.0.0.1", 8080),
        Forward("udp", "127.0.0.1", 53),
        Forward("tcp", "127.0.0.1", 9),
    )
    assert plan({keep: 1, stale: 2}, {keep, new}) == ([new], [2])
    assert plan({keep: 1}, {keep}) == ([], [])


# --- the machine's publishing policy, held by the keeper too ----------------------------------


def _container(created: int, *ports: tuple[str, int], state: str = "running") -> dict[str, Any]:
    listed = [{"IP": "0.0.0.0", "PrivatePort": 80, "PublicPort": n, "Type": p} for p, n in ports]
    return {"State": state, "Created": created, "Ports": listed}


DEFAULT = policy_from({})


def test_the_ports_published_are_listed_once_the_oldest_containers_first() -> None:
    newer, older = _container(20, ("tcp", 9001), ("tcp", 9000)), _container(10, ("udp", 9002), ("tcp", 9000))
    assert published_ports([newer, older, _container(5, ("tcp", 1), state="exited")]) == [
        ("udp", 9002), ("tcp", 9000), ("tcp", 9001)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "ports", "keep", "admitted", "skipped"),
    [
        ({}, [("tcp", 80), ("udp", 53), ("tcp", 8080)], (), [("tcp", 8080)], [
            "port tcp 80 not published: outside this machine's publish-ports 1024-65535",
            "port udp 53 not published: outside this machine's publish-ports 1024-65535",
        ]),
        ({"publish-ports": "80-65535"}, [("tcp", 80)], (), [("tcp", 80)], []),
        ({"publish-limit": "2"}, [("tcp", 9000), ("tcp", 9001), ("tcp", 9002)], (),
         [("tcp", 9000), ("tcp", 9001)],
         ["port tcp 9002 not published: the repo publishes 2 ports, this machine's publish-limit"]),
        # What is forwarded already keeps its place: a new container does not take it over.
        ({"publish-limit": "1"}, [("tcp", 9000), ("tcp", 9001)], [("tcp", 9001)], [("tcp", 9001)],
         ["port tcp 9000 not published: the repo publishes 1 ports, this machine's publish-limit"]),
        ({"publish-limit": "0"}, [("tcp", 9000)], (), [],
         ["port tcp 9000 not published: the repo publishes 0 ports, this machine's publish-limit"]),
    ],
)  # fmt: skip
def test_the_keeper_publishes_only_what_the_policy_allows(
    settings: dict[str, str],
    ports: list[Port],
    keep: list[Port],
    admitted: list[Port],
    skipped: list[str],
) -> None:
    assert admit(ports, policy_from(settings), keep) == (admitted, skipped)


def test_wanted_holds_the_policy() -> None:
    low = _container(1, ("tcp", 80), ("tcp", 8080))
    assert wanted([low], ["127.0.0.1"]) == {Forward("tcp", "127.0.0.1", 8080)}
    assert len(wanted([_container(1, *[("tcp", 9000 + i) for i in range(100)])], ["127.0.0.1"])) == 64


class _Uplink:
    """slirp4netns's API as the keeper sees it: forwards by id, one host port refused as taken."""

    def __init__(self, taken: int = 0) -> None:
        self.forwards: dict[int, dict[str, Any]] = {}
        self.taken = taken
        self.adds = 0

    def __call__(self, api: Path, request: Mapping[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        what, arguments = request["execute"], request.get("arguments", {})
        if what == "list_hostfwd":
            # As slirp4netns answers it: not under "return", unlike its other commands.
            return {"entries": [{"id": i, **f} for i, f in self.forwards.items()]}
        if what == "remove_hostfwd":
            self.forwards.pop(arguments["id"])
            return {"return": {}}
        if arguments["host_port"] == self.taken:
            return {"error": {"desc": "bad request: add_hostfwd: slirp_add_hostfwd failed"}}
        self.adds += 1
        self.forwards[self.adds] = arguments
        return {"return": {"id": self.adds}}


def test_the_keeper_says_each_skip_once_and_writes_what_it_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listing = [_container(1, ("tcp", 80), ("tcp", 8080), ("tcp", 8081))]
    monkeypatch.setattr(unixhttp, "request", lambda *a, **k: (200, json.dumps(listing).encode()))
    uplink = _Uplink(taken=8081)
    monkeypatch.setattr(ports, "call", uplink)
    lines: list[str] = []
    keeping = ports.Keeping(tmp_path / "published" / "abc.json")
    for _ in range(3):
        ports.reconcile(
            tmp_path / "d.sock", tmp_path / "api.sock", ["127.0.0.1"], lines.append, DEFAULT, keeping
        )
    assert lines.count("port tcp 80 not published: outside this machine's publish-ports 1024-65535") == 1
    assert "published tcp 127.0.0.1:8080" in lines
    assert any(line.startswith("port tcp 127.0.0.1:8081 not published: ") for line in lines)
    assert read_state(keeping.state or Path()) == {("tcp", 8080)}  # the taken one is not counted
    assert uplink.adds == 1  # what it forwards already is read back, not added again
    listing.clear()
    ports.reconcile(tmp_path / "d.sock", tmp_path / "api.sock", ["127.0.0.1"], lines.append, DEFAULT, keeping)
    assert uplink.forwards == {} and lines[-1] == "withdrew 1 published port(s)"
    assert read_state(keeping.state or Path()) == set()
