"""A tunnel is keyed by what it reaches, and handed out again only while it answers.

The ssh process, the machine's answer and the ping are stood in for; what is checked is which
tunnel `open_tunnel` hands out, which it opens and which it closes (tests/ssh/test_tunnels.py does
the same for real).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rediacc_core.config import Config
from rediacc_core.remote import tunnel
from rediacc_core.remote.address import SshAddress
from rediacc_core.remote.ssh import CONTROL_DIR_ENV, SshMachine
from rediacc_core.remote.tunnel import Far, Tunnel


def far(**changes: str | tuple[str, ...]) -> Far:
    base = Far(
        config="/home/me/.config/rediacc/config.yaml",
        machine="fa",
        address="root@fleet-a:22",
        identity="/home/me/.ssh/id_fa",
        host_keys=("ssh-ed25519 AAAAkeyA",),
        root="/srv/ra",
        ref="alpha@fa",
        repo_id="0f1e2d3c-0000-4000-8000-000000000001",
        gate="/srv/ra/run/rediacc/0f1e2d3c0000/gate.sock",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"config": "/home/me/other.yaml"},
        {"address": "root@fleet-b:22"},
        {"identity": "/home/me/.ssh/id_other"},
        {"host_keys": ("ssh-ed25519 AAAAkeyB",)},
        {"root": "/srv/rb"},
        {"repo_id": "0f1e2d3c-0000-4000-8000-000000000002"},
        {"gate": "/srv/ra/run/rediacc/0f1e2d3c0002/gate.sock"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_every_part_of_what_a_tunnel_reaches_names_another_socket(
    change: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path))
    assert tunnel.socket_for(far(**change)) != tunnel.socket_for(far())
    assert tunnel.socket_for(far()) == tunnel.socket_for(far())


class Stand:
    """The machine's answer (`reach`), whether gates answer (`answering`), and the ssh processes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, config: Config) -> None:
        self.config = config
        self.reach = far(config=str(config.path.absolute()))
        self.answering = True
        self.spawned: list[Path] = []
        monkeypatch.setattr(tunnel, "locate", lambda _c, _m, _r: self.reach)
        monkeypatch.setattr(tunnel, "_spawn", self._spawn)
        monkeypatch.setattr(tunnel, "is_open", lambda t: t.control.exists())
        monkeypatch.setattr(tunnel, "answers", lambda _s: self.answering)
        monkeypatch.setattr(tunnel, "_control", lambda t, _cmd: 0)
        monkeypatch.setattr(SshMachine, "trusted_keys", lambda _s: ["rdc.fa ssh-ed25519 AAAAkeyA"])

    def _spawn(self, _ssh: SshMachine, opened: Tunnel) -> None:
        opened.socket.touch()
        opened.control.touch()
        self.spawned.append(opened.socket)

    def open(self) -> Path:
        return tunnel.open_tunnel(self.config, self.config.machine("fa"), "alpha@fa").socket


@pytest.fixture
def stand(rdc_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Stand:
    monkeypatch.setenv(CONTROL_DIR_ENV, str(tmp_path / "cm"))
    config = Config.load()
    config.add_ssh("fa", SshAddress.parse("root@fleet-a"), "/srv/ra")
    config.save()
    return Stand(monkeypatch, config)


def test_an_open_tunnel_that_answers_is_found_again(stand: Stand) -> None:
    first = stand.open()
    assert stand.open() == first and stand.spawned == [first]


def test_a_tunnel_that_does_not_answer_is_closed_and_opened_anew(stand: Stand) -> None:
    first = stand.open()
    stand.answering = False
    assert stand.open() == first and stand.spawned == [first, first]


def test_a_recreated_repo_gets_a_new_tunnel_and_the_old_one_is_closed(stand: Stand) -> None:
    old = stand.open()
    stand.reach = dataclasses.replace(stand.reach, repo_id="new-id", gate="/srv/ra/run/rediacc/new/gate.sock")
    new = stand.open()
    assert new != old and stand.spawned == [old, new]
    assert not old.exists() and not old.with_suffix(".ctl").exists()
    assert [t.socket for t in tunnel.tunnels(stand.config)] == [new]


def test_a_machine_behind_another_host_key_gets_a_new_tunnel(stand: Stand) -> None:
    old = stand.open()
    stand.reach = dataclasses.replace(stand.reach, host_keys=("ssh-ed25519 AAAAreinstalled",))
    assert stand.open() != old and not old.exists()


def test_another_config_naming_its_machine_fa_gets_a_tunnel_of_its_own(stand: Stand, tmp_path: Path) -> None:
    mine = stand.open()
    other = Config(tmp_path / "other.yaml")
    stand.config, saved = other, stand.config
    other.add_ssh("fa", SshAddress.parse("root@fleet-a"), "/srv/rb")
    stand.reach = far(config=str(other.path.absolute()), root="/srv/rb")
    theirs = stand.open()
    assert theirs != mine and mine.exists()  # neither handed out to the other nor closed by it
    assert tunnel.close_tunnels(saved, "fa") == 1
    assert not mine.exists() and theirs.exists()
    assert [t.socket for t in tunnel.tunnels(other)] == [theirs]


def test_a_record_that_is_not_a_tunnels_is_ignored(stand: Stand) -> None:
    (tunnel.socket_for(stand.reach).parent / "gate-junk.json").write_text("not json")
    assert tunnel.tunnels(stand.config) == []
