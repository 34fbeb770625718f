"""At a grant's end a running holder keeps its device unless the machine says `lease-end=stop`;
then the repo's gate stops it at its next housekeeping round."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from grants_kit import GPU, build_machine, fake_plugins

from rediacc_core.grants import GrantStore
from rediacc_core.holdings import Holder
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.lease_end import stop_lapsed_holders
from rediacc_core.runtime.logfiles import LogKeeper
from rediacc_core.settings import set_setting
from rediacc_core.testing import FakeMachine


@pytest.fixture
def box(make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    return build_machine(make_fake_machine("box"))


def holders_of(repo: Repo) -> list[Holder]:
    return [
        Holder(repo, "a" * 64, "ended", "running", (f"{GPU}=0",)),
        Holder(repo, "b" * 64, "granted", "running", (f"{GPU}=1",)),
        Holder(repo, "c" * 64, "exited", "exited", (f"{GPU}=0",)),
    ]


def run(box: Machine, repo: Repo) -> tuple[list[str], list[str]]:
    stopped: list[str] = []
    log: list[str] = []
    stop_lapsed_holders(
        box, repo, log.append, holders=lambda: holders_of(repo), stop=lambda h: stopped.append(h.name)
    )
    return stopped, log


def test_by_default_running_holders_keep_their_device(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    assert run(box, repo) == ([], [])


def test_with_stop_the_running_holders_of_ended_grants_are_stopped(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    GrantStore(box, fake_plugins()).grant(repo, [f"{GPU}=1"])
    set_setting(box, "lease-end", "stop")
    stopped, log = run(box, repo)
    assert stopped == ["ended"]  # not the one still granted, not the one already exited
    assert log == [f"lease-end: stopped container ended, whose grant of {GPU}=0 ended"]


def test_unreadable_grants_stop_nothing_and_say_why(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    set_setting(box, "lease-end", "stop")
    box.grants_path.write_text("{broken")
    stopped, log = run(box, repo)
    assert stopped == [] and log and log[0].startswith("lease-end check skipped")


def test_the_gate_runs_it_with_its_log_housekeeping(tmp_path: object) -> None:
    rounds: list[int] = []
    keeper = LogKeeper(
        [], chores=[lambda: rounds.append(1), lambda: 1 / 0], report=lambda line: rounds.append(2)
    )
    keeper.check()
    assert rounds == [1, 2]  # a failing chore is reported and the round goes on
