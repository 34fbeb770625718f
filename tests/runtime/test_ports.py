"""Which slirp4netns forwards a repo's running containers call for, and how the port keeper gets
there from the forwards that exist."""

from __future__ import annotations

from rediacc_core.runtime.ports import Forward, plan, wanted

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
