"""The kernel path out of a repo's namespace: which path a repo takes, the address pair each repo
gets (never another repo's, kept across restarts, freed with the repo), and the host rules that
keep its promises, checked as the iptables-restore text they are."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from rediacc_core.errors import StateError, ToolError
from rediacc_core.runtime import kernelpath, layout

SHORT = "0123456789ab"
BLOCKED = ["169.254.0.0/16", "172.17.0.0/16", "192.0.2.2/32"]


def test_auto_takes_the_kernel_path_only_where_the_host_forwards() -> None:
    assert kernelpath.choose("auto", True) == "kernel"
    assert kernelpath.choose("auto", False) == "user"
    assert kernelpath.choose("user", True) == "user"
    assert kernelpath.choose("kernel", True) == "kernel"


def test_forcing_the_kernel_path_where_the_host_does_not_forward_says_why_and_what_to_do() -> None:
    with pytest.raises(StateError) as refused:
        kernelpath.choose("kernel", False)
    assert (
        "does not forward IPv4" in refused.value.what and "does not turn forwarding on" in refused.value.what
    )
    assert "rdc machine config NAME --unset net-path" in refused.value.todo


def test_a_namespace_keeps_the_path_it_came_up_with_whatever_the_setting_says_now() -> None:
    assert kernelpath.choose("user", True, recorded="kernel") == "kernel"
    assert kernelpath.choose("kernel", False, recorded="user") == "user"


def test_each_slot_is_a_pair_of_addresses_of_its_own_in_the_range() -> None:
    pairs = [kernelpath.slot(i) for i in (0, 1, kernelpath.SLOTS - 1)]
    assert [(p.host, p.inside) for p in pairs[:2]] == [
        ("10.199.0.1", "10.199.0.2"),
        ("10.199.0.5", "10.199.0.6"),
    ]
    assert pairs[2].inside == "10.199.255.254"
    for pair in pairs:
        assert pair.network.subnet_of(kernelpath.RANGE)
    with pytest.raises(ValueError):
        kernelpath.slot(kernelpath.SLOTS)


def test_the_free_slot_is_the_lowest_no_repo_holds_nor_the_host_reaches_directly() -> None:
    assert kernelpath.free_slot(set(), []).index == 0
    assert kernelpath.free_slot({0, 1, 3}, []).index == 2
    # A network of the host's own inside the range (a VPN's /24) is skipped; a broader route
    # (10.0.0.0/8 through a gateway) is not in the way.
    assert kernelpath.free_slot(set(), ["10.199.0.0/24", "10.0.0.0/8"]).index == 64
    # A /30 of the range the host reaches is in the way too (a veth whose repo lost its lease,
    # or anything else's): only the repo's own veth is left out, by the caller.
    assert kernelpath.free_slot(set(), ["10.199.0.0/30"]).index == 1


def test_a_lease_another_repo_holds_too_is_not_reused(tmp_path: Path) -> None:
    repos = _repos(tmp_path)
    first = kernelpath.allocate(repos / "a", {"a", "b"}, [])
    (repos / "b").mkdir()
    (repos / "b" / kernelpath.LEASE).write_text(json.dumps({"repo": "b", "slot": first.index}) + "\n")
    again = kernelpath.allocate(repos / "b", {"a", "b"}, [])
    assert again != first and kernelpath.allocate(repos / "b", {"a", "b"}, []) == again


def test_a_full_range_says_how_to_free_a_slot() -> None:
    with pytest.raises(StateError) as full:
        kernelpath.free_slot(set(range(kernelpath.SLOTS)), [])
    assert "rdc repo list --all" in full.value.todo and "net-path=user" in full.value.todo


def _repos(tmp_path: Path) -> Path:
    repos = tmp_path / "var" / "lib" / "rediacc" / "repos"
    repos.mkdir(parents=True)
    return repos


def test_repos_get_different_slots_and_each_keeps_its_own_across_restarts(tmp_path: Path) -> None:
    repos = _repos(tmp_path)
    a, b = repos / "aaaa", repos / "bbbb"
    known = {"aaaa", "bbbb"}
    first = kernelpath.allocate(a, known, [])
    second = kernelpath.allocate(b, known, [])
    assert first != second
    assert kernelpath.allocate(a, known, []) == first  # kept: the next up finds it
    assert json.loads((a / kernelpath.LEASE).read_text()) == {"repo": "aaaa", "slot": first.index}


def test_a_deleted_repos_slot_is_freed_and_comes_round_again_only_after_every_other(
    tmp_path: Path,
) -> None:
    # The host's connection tracking may still hold the deleted repo's flows: their replies must
    # not reach the next repo up, so a freed slot is handed out again only after all the others.
    repos = _repos(tmp_path)
    gone = kernelpath.allocate(repos / "gone", {"gone"}, [])
    new = kernelpath.allocate(repos / "new", {"new"}, [])
    assert not (repos / "gone" / kernelpath.LEASE).exists()
    assert new.index == gone.index + 1
    (repos / ".net-slots.next").write_text(f"{kernelpath.SLOTS - 1}\n")  # every slot handed out once
    last = kernelpath.allocate(repos / "last", {"new", "last"}, [])
    wrapped = kernelpath.allocate(repos / "wrapped", {"new", "last", "wrapped"}, [])
    assert (last.index, wrapped.index) == (kernelpath.SLOTS - 1, gone.index)


def test_the_free_slot_search_starts_where_it_is_told_and_wraps_round() -> None:
    assert kernelpath.free_slot({5}, [], start=5).index == 6
    assert kernelpath.free_slot(set(), [], start=kernelpath.SLOTS - 1).index == kernelpath.SLOTS - 1
    assert kernelpath.free_slot({kernelpath.SLOTS - 1}, [], start=kernelpath.SLOTS - 1).index == 0


def test_a_forks_copied_lease_holds_nothing(tmp_path: Path) -> None:
    """A fork copies its source's state directory, lease included: that lease names the source,
    so the fork takes a slot of its own."""
    repos = _repos(tmp_path)
    source = kernelpath.allocate(repos / "src", {"src", "fork"}, [])
    (repos / "fork").mkdir()
    (repos / "fork" / kernelpath.LEASE).write_text((repos / "src" / kernelpath.LEASE).read_text())
    fork = kernelpath.allocate(repos / "fork", {"src", "fork"}, [])
    assert fork != source


def _rules() -> tuple[list[str], list[str]]:
    filt, nat = kernelpath.host_rules(SHORT, kernelpath.slot(3), BLOCKED)
    return filt.splitlines(), nat.splitlines()


def test_the_host_rules_are_the_repos_own_chains_replaced_whole() -> None:
    filt, nat = _rules()
    into, forward, masq = kernelpath.chain_names(SHORT)
    assert (filt[0], filt[-1], nat[0], nat[-1]) == ("*filter", "COMMIT", "*nat", "COMMIT")
    assert filt[1:3] == [f":{into} - [0:0]", f":{forward} - [0:0]"]
    chains = {line.split()[1] for line in filt + nat if line.startswith("-A ")}
    assert chains == {into, forward, masq}  # nothing is written into a chain of the host's
    for name in (into, forward, masq):
        assert len(name) <= 28  # iptables' longest chain name


def test_nothing_from_the_veth_reaches_the_host_itself_by_any_address() -> None:
    filt, _ = _rules()
    into = kernelpath.chain_names(SHORT)[0]
    assert [line for line in filt if line.startswith(f"-A {into} ")] == [
        f"-A {into} ! -s 10.199.0.14/32 -j DROP",  # a forged source gets no ICMP
        f"-A {into} -j REJECT --reject-with icmp-admin-prohibited",
    ]


def test_forwarded_packets_reach_the_outside_but_no_host_address_repo_or_direct_network() -> None:
    filt, _ = _rules()
    forward = kernelpath.chain_names(SHORT)[1]
    out = [line.removeprefix(f"-A {forward} -i rdc{SHORT} ") for line in filt if f"-i rdc{SHORT} " in line]
    reject = "-j REJECT --reject-with icmp-admin-prohibited"
    assert out == [
        "! -s 10.199.0.14/32 -j DROP",  # first: a forged source goes nowhere, silently
        f"-m addrtype --dst-type LOCAL {reject}",  # the host's addresses, later ones too
        f"-d 10.199.0.0/16 {reject}",  # every repo's namespace and veth
        *(f"-d {cidr} {reject}" for cidr in BLOCKED),  # the host's own networks, metadata
    ]  # the rest returns to FORWARD, whose ACCEPT for the veth is appended after the host's rules


def test_the_refusals_are_made_again_in_raw_where_no_later_rule_of_the_host_comes_first() -> None:
    raw = kernelpath.raw_rules(SHORT, kernelpath.slot(3), BLOCKED).splitlines()
    chain = f"RDC-{SHORT}-RAW"
    assert (raw[0], raw[1], raw[-1]) == ("*raw", f":{chain} - [0:0]", "COMMIT")
    assert [line.removeprefix(f"-A {chain} ") for line in raw if line.startswith("-A")] == [
        "! -s 10.199.0.14/32 -j DROP",
        "-m addrtype --dst-type LOCAL -j DROP",  # before the host's DNAT: its forwarded ports too
        "-d 10.199.0.0/16 -j DROP",
        *(f"-d {cidr} -j DROP" for cidr in BLOCKED),
    ]


def test_inside_the_namespace_everything_leaving_by_the_veth_is_masqueraded_and_invalid_dropped() -> None:
    script = kernelpath.inside_rules()
    assert "iptables -t nat -I POSTROUTING 1 -o kpath0 -j MASQUERADE" in script
    assert "iptables -t mangle -I POSTROUTING 1 -o kpath0 -m conntrack --ctstate INVALID -j DROP" in script
    drop_new = "-i kpath0 -m conntrack ! --ctstate ESTABLISHED,RELATED -j DROP"
    assert f"iptables -t mangle -I PREROUTING 1 {drop_new}" in script  # nothing starts a connection in
    assert script.count(" -C ") == 3  # checked first: written again, nothing doubles


def test_nothing_starts_a_connection_into_a_repos_namespace_from_outside() -> None:
    filt, _ = _rules()
    forward = kernelpath.chain_names(SHORT)[1]
    into = [line for line in filt if f"-o rdc{SHORT} " in line]
    assert into == [
        f"-A {forward} -o rdc{SHORT} -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A {forward} -o rdc{SHORT} -j REJECT --reject-with icmp-admin-prohibited",
    ]


def test_only_the_repos_own_address_is_masqueraded_and_only_outside_the_range() -> None:
    _, nat = _rules()
    masq = kernelpath.chain_names(SHORT)[2]
    assert [line for line in nat if line.startswith("-A")] == [
        f"-A {masq} -s 10.199.0.14/32 ! -d 10.199.0.0/16 -j MASQUERADE"
    ]


def test_the_jumps_catch_only_the_repos_veth_and_address() -> None:
    into, forward, masq = kernelpath.chain_names(SHORT)
    assert kernelpath.jumps(SHORT, kernelpath.slot(3)) == [
        ("raw", "PREROUTING", ["-i", f"rdc{SHORT}", "-j", f"RDC-{SHORT}-RAW"]),
        ("filter", "INPUT", ["-i", f"rdc{SHORT}", "-j", into]),
        ("filter", "FORWARD", ["-i", f"rdc{SHORT}", "-j", forward]),
        ("filter", "FORWARD", ["-o", f"rdc{SHORT}", "-j", forward]),
        ("nat", "POSTROUTING", ["-s", "10.199.0.14/32", "-j", masq]),
        ("filter", "FORWARD", ["-i", f"rdc{SHORT}", "-j", "ACCEPT"]),
    ]
    assert len(kernelpath.veth_name(SHORT)) <= 15  # IFNAMSIZ - 1


def test_a_rule_set_written_again_gains_only_the_jumps_it_lacks() -> None:
    at = kernelpath.slot(3)
    into, forward, masq = kernelpath.chain_names(SHORT)
    nothing = kernelpath.missing_jumps({}, SHORT, at)
    assert nothing == {
        "raw": [f"-I PREROUTING 1 -i rdc{SHORT} -j RDC-{SHORT}-RAW"],
        "filter": [
            f"-I INPUT 1 -i rdc{SHORT} -j {into}",
            f"-I FORWARD 1 -i rdc{SHORT} -j {forward}",
            f"-I FORWARD 1 -o rdc{SHORT} -j {forward}",
            f"-A FORWARD -i rdc{SHORT} -j ACCEPT",  # last: the host's own FORWARD rules come first
        ],
        "nat": [f"-I POSTROUTING 1 -s 10.199.0.14/32 -j {masq}"],
    }
    # As `iptables -S` lists them, with one jump lost (an operator's -D, a reload of the firewall).
    listed = {
        "filter": "\n".join(
            [
                "-P INPUT ACCEPT",
                f"-A INPUT -i rdc{SHORT} -j {into}",
                f"-A FORWARD -o rdc{SHORT} -j {forward}",
                f"-A FORWARD -i rdc{SHORT} -j ACCEPT",
                "",
            ]
        ),
        "nat": f"-A POSTROUTING -s 10.199.0.14/32 -j {masq}\n",
    }
    assert kernelpath.missing_jumps(listed, SHORT, at) == {
        "raw": [f"-I PREROUTING 1 -i rdc{SHORT} -j RDC-{SHORT}-RAW"],
        "filter": [f"-I FORWARD 1 -i rdc{SHORT} -j {forward}"],
        "nat": [],
    }
    filt, _ = kernelpath.host_rules(SHORT, at, [])
    written = kernelpath.with_lines(filt, ["-I INPUT 1 -j X"]).splitlines()
    assert written[-2:] == ["-I INPUT 1 -j X", "COMMIT"] and written.count("COMMIT") == 1


def test_the_path_record_reads_back_what_was_written(tmp_path: Path) -> None:
    net = layout.network_for(SHORT, tmp_path, tmp_path / "state")
    assert layout.path_of(net) is None
    net.workdir.mkdir()
    net.path_record.write_text("kernel 7\n")
    assert layout.path_of(net) == ("kernel", kernelpath.slot(7))
    net.path_record.write_text("user\n")
    assert layout.path_of(net) == ("user", None)
    net.path_record.write_text("kernel 999999\n")  # out of the range: no path
    assert layout.path_of(net) is None
    assert ipaddress.ip_network(kernelpath.RANGE).is_private


def test_the_rules_are_intact_only_with_every_jump_and_every_rule_of_the_repos_chains() -> None:
    at = kernelpath.slot(3)
    filt, nat = kernelpath.host_rules(SHORT, at, BLOCKED)
    raw = kernelpath.raw_rules(SHORT, at, BLOCKED)
    jumps = kernelpath.missing_jumps({}, SHORT, at)
    saved = "".join(
        kernelpath.with_lines(
            text, [line.replace("-I ", "-A ").replace(" 1 ", " ", 1) for line in jumps[table]]
        )
        for table, text in (("raw", raw), ("filter", filt), ("nat", nat))
    )
    have = kernelpath.tables_of(saved)
    assert kernelpath.intact(have, SHORT, at, BLOCKED)
    flushed = dict(have, filter="")  # iptables -F, a reload without --noflush
    assert not kernelpath.intact(flushed, SHORT, at, BLOCKED)
    emptied = dict(have, raw="\n".join(line for line in have["raw"].splitlines() if "DROP" not in line))
    assert not kernelpath.intact(emptied, SHORT, at, BLOCKED)  # the jump there, its chain empty
    assert not kernelpath.intact(have, SHORT, at, [*BLOCKED, "198.18.0.0/15"])  # a destination since


def test_a_failed_iptables_save_is_an_error_not_a_host_with_no_rules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read as empty, every jump of the repo's would look missing and be added again each time."""
    (tmp_path / "iptables-save").write_text("#!/bin/sh\necho 'iptables-save: lock held' >&2\nexit 4\n")
    (tmp_path / "iptables-save").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolError, match="iptables-save failed: iptables-save: lock held"):
        kernelpath.saved()
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    with pytest.raises(ToolError, match="cannot run iptables-save"):
        kernelpath.saved()
