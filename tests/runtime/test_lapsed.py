"""At a grant's end a running holder keeps its device unless the machine says `lease-end=stop`;
then the repo's gate empties the repo at its next housekeeping round: every running container of
it is stopped, since one that names no device may hold it through a descriptor in flight."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest
from grants_kit import GPU, build_machine, fake_plugins

from rediacc_core import telemetry
from rediacc_core.bindings import MOVED, Suspension
from rediacc_core.grants.records import Grant, read_all, read_grants, residue, write_grants
from rediacc_core.grants.store import GrantStore
from rediacc_core.machine import Machine
from rediacc_core.plugins import set_plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.holdings import Holder, Holdings
from rediacc_core.runtime.lapsed import stop_lapsed_holders
from rediacc_core.runtime.logfiles import LogKeeper
from rediacc_core.runtime.openers import Opener
from rediacc_core.runtime.serve import log_keeper
from rediacc_core.settings import set_setting
from rediacc_core.statelock import state_lock
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


def run(
    box: Machine,
    repo: Repo,
    held: list[Opener] | None = None,
    *,
    more: tuple[Holder, ...] = (),
    holders: bool = True,
) -> tuple[list[str], list[str]]:
    """One housekeeping round on `repo`'s containers (holders_of unless not `holders`, and `more`):
    what it stopped, and what it logged."""
    stopped: list[str] = []
    log: list[str] = []
    holding = list(held or [])
    containers = (holders_of(repo) if holders else []) + list(more)

    def stop(holder: Holder) -> None:
        stopped.append(holder.name)
        holding[:] = [o for o in holding if o.container != holder.id]
        containers[:] = [replace(c, state="exited") if c.id == holder.id else c for c in containers]

    stop_lapsed_holders(
        box,
        repo,
        log.append,
        holders=lambda: [c for c in containers if c.cdi],
        stop=stop,
        openers=lambda r, n: list(holding),
        containers=lambda: [c for c in containers if c.running],
        outside=lambda: [f"{o.process}" for o in holding if o.container is None],
    )
    return stopped, log


def test_by_default_running_holders_keep_their_device(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    assert run(box, repo) == ([], [])


def test_with_stop_a_running_holder_of_an_ended_grant_empties_the_repo(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    GrantStore(box, fake_plugins(), running=Holdings(box)).grant(repo, [f"{GPU}=1"])
    set_setting(box, "lease-end", "stop")
    stopped, log = run(box, repo, more=(Holder(repo, "e" * 64, "plain", "running", ()),))
    assert sorted(stopped) == ["ended", "granted", "plain"]  # every running one; not the exited one
    assert f"lease-end: stopped container ended, whose grant of {GPU}=0 ended" in log
    assert (
        "lease-end: stopped container plain, emptying the repo (a descriptor in flight shows in no scan)"
        in log
    )
    assert read_all(box).draining == ()  # the drain is lifted once it is empty


def test_with_stop_an_ended_lease_empties_the_repo_and_clears_its_residue(box: Machine) -> None:
    """No scan sees a descriptor in flight: the lease's end alone is reason enough."""
    repo = RepoStore(box).create("alpha")
    set_setting(box, "lease-end", "stop")
    with state_lock(box):
        write_grants(box, [Grant(repo.id, f"{GPU}=0", False, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")])
    assert [r.how for r in residue(read_all(box))] == ["lease-end"]
    stopped, _ = run(box, repo, more=(Holder(repo, "e" * 64, "plain", "running", ()),))
    assert sorted(stopped) == ["ended", "granted", "plain"]
    assert residue(read_all(box)) == []
    plain = Holder(repo, "f" * 64, "later", "running", ())
    assert run(box, repo, more=(plain,), holders=False) == ([], [])  # its next containers are left alone


def test_with_stop_the_running_holders_of_suspended_grants_are_stopped(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    store = GrantStore(box, fake_plugins(), running=Holdings(box))
    store.grant(repo, [f"{GPU}=0", f"{GPU}=1"])
    with state_lock(box):  # what setup's re-check records when card 0's name moved
        held = Suspension(MOVED, "it now reaches another card", "2026-01-01T00:00:00Z")
        write_grants(
            box, [replace(g, suspended=held) if g.device == f"{GPU}=0" else g for g in read_grants(box)]
        )
    set_setting(box, "lease-end", "stop")
    stopped, _ = run(box, repo)
    assert "ended" in stopped  # its grant of gpu=0 is suspended


def test_with_stop_a_container_whose_process_holds_a_node_it_is_not_granted_is_stopped(box: Machine) -> None:
    """Whatever its container named: a descriptor passed to it over a socket, a hard link of the node."""
    repo = RepoStore(box).create("alpha")
    GrantStore(box, fake_plugins(), running=Holdings(box)).grant(repo, [f"{GPU}=0", f"{GPU}=1"])
    set_setting(box, "lease-end", "stop")
    passed = Opener(42, "sleep (pid 42)", ("c", 1, 7), "fd 3 (/gpu0)", "d" * 64)
    stopped, log = run(box, repo, [passed], more=(Holder(repo, "d" * 64, "keeper", "running", ()),))
    assert sorted(stopped) == ["ended", "granted", "keeper"]
    assert (
        "lease-end: stopped container keeper, whose processes held a device not granted: "
        "sleep (pid 42) holds device c 1:7 as fd 3 (/gpu0)"
    ) in log


def test_with_stop_a_process_outside_any_container_is_named_for_repo_down(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    GrantStore(box, fake_plugins(), running=Holdings(box)).grant(repo, [f"{GPU}=1"])
    set_setting(box, "lease-end", "stop")
    escaped = Opener(43, "sleep (pid 43)", ("c", 1, 7), "fd 4 (/gpu0)", None)
    _, log = run(box, repo, [escaped])
    assert len(log) == 1 and "sleep (pid 43), outside any container of alpha@box" in log[0]
    assert "`rdc repo down alpha@box`" in log[0]
    assert read_all(box).draining == ()  # lifted: the revocation and the residue stay


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


def test_a_lease_that_ended_leaves_the_telemetry_at_the_gates_next_housekeeping_round(
    box: Machine, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """A lease ends without a write to the grants file: the round every gate runs each 30 s
    (`serve.log_keeper`) brings the GPU telemetry up to date."""
    # The round asks the process-wide plugins (its health chore): the fake vendor's, chosen for this
    # test only (an environment variable would be read once, then cached for every later test).
    set_plugins(fake_plugins())
    request.addfinalizer(lambda: set_plugins(None))
    alpha = RepoStore(box).create("alpha")
    nobody = Holdings(box, holders=lambda repo: [], stop=lambda holder: None)  # no daemon runs
    GrantStore(box, fake_plugins(), running=nobody).grant(
        alpha, [f"{GPU}=0"], expires_at="2999-01-01T00:00:00Z"
    )
    series = f'rediacc_gpu_grant_info{{repo="alpha",device="{GPU}=0"'
    assert series in telemetry.metrics_path(box).read_text()
    monkeypatch.setattr("rediacc_core.grants.records.now_iso", lambda: "3000-01-01T00:00:00Z")
    said: list[str] = []
    log_keeper(box, alpha, said.append).check()
    assert series not in telemetry.metrics_path(box).read_text(), said
