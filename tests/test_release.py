"""Freeing hardware (`grants.release`): the revocation and the drain mark are written before any
container is stopped, the repo is listed again until nothing of it runs, and the new grant is
written last, with the drain lifted. A repo whose grant ended while it runs anything (residue) keeps
an exclusive grant of the same hardware from another repo until it runs nothing."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest
from grants_kit import GPU, build_machine, fake_plugins

from rediacc_core.errors import RefusedError, StateError
from rediacc_core.grants.records import Grant, read_all, read_grants, residue
from rediacc_core.grants.release import empty_repos
from rediacc_core.grants.store import GrantStore
from rediacc_core.machine import Machine
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.guard import drain_of
from rediacc_core.runtime.holdings import Holder, Holdings
from rediacc_core.statelock import state_lock
from rediacc_core.testing import FakeMachine


@pytest.fixture
def box(make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    return build_machine(make_fake_machine("box"))


class Daemons:
    """The repos' running parts as the daemons and /proc would show them; each stop is recorded
    with what the grants file said at that moment."""

    def __init__(self, box: Machine, *containers: Holder) -> None:
        self.box = box
        self.containers = list(containers)
        self.seen: list[tuple[str, list[str], list[str]]] = []  # (stopped, repo ids draining, grants)
        self.escaped: dict[str, list[str]] = {}

    def running(self, repo: Repo) -> list[Holder]:
        return [c for c in self.containers if c.repo.id == repo.id and c.running]

    def stop(self, holder: Holder) -> None:
        found = read_all(self.box)
        self.seen.append(
            (
                holder.name,
                [d.repo_id for d in found.draining],
                [f"{g.repo_id}:{g.device}" for g in found.grants],
            )
        )
        self.containers = [replace(c, state="exited") if c.id == holder.id else c for c in self.containers]

    def outside(self, repo: Repo) -> list[str]:
        return self.escaped.get(repo.id, [])

    def holdings(self) -> Holdings:
        return Holdings(
            self.box,
            holders=lambda repo: [c for c in self.containers if c.repo.id == repo.id and c.cdi],
            stop=self.stop,
            openers=lambda repo, nodes: [],
            containers=self.running,
            outside=self.outside,
        )


def container(repo: Repo, name: str, *cdi: str) -> Holder:
    return Holder(repo, f"{name}-{'0' * 60}", name, "running", tuple(cdi))


@pytest.fixture
def repos(box: Machine) -> tuple[Repo, Repo]:
    store = RepoStore(box)
    return store.create("alpha"), store.create("beta")


def test_a_take_over_revokes_and_drains_before_any_stop_and_grants_last(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    # Y names no device: it holds the descriptor in flight, which no scan sees.
    daemons = Daemons(box, container(alpha, "x", f"{GPU}=0"), container(alpha, "y"))
    store = GrantStore(box, fake_plugins(), running=daemons.holdings())
    store.grant(alpha, [f"{GPU}=0"])
    (outcome,) = store.grant(beta, [f"{GPU}=0"], exclusive=True, take_over=True)
    assert sorted(h.name for h in outcome.stopped) == ["x", "y"]  # every container, not only holders
    for _, draining, grants in daemons.seen:  # at every stop: alpha draining, its grant gone, beta's not yet
        assert draining == [alpha.id] and grants == []
    assert [(g.repo_id, g.exclusive) for g in read_grants(box)] == [(beta.id, True)]
    assert read_all(box).draining == () and residue(read_all(box)) == []


def test_the_drain_mark_refuses_every_start_at_the_runtime_guard_until_its_bound(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    daemons = Daemons(box, container(alpha, "y"))
    seen: list[str | None] = []

    def stop(holder: Holder) -> None:
        import json
        import time

        document = json.loads(box.grants_path.read_text())
        seen.append(drain_of(document, alpha.id, time.time()))
        seen.append(drain_of(document, beta.id, time.time()))
        seen.append(drain_of(document, alpha.id, time.time() + 3600))  # past its bound
        daemons.stop(holder)

    with state_lock(box):
        empty_repos(
            box,
            Holdings(box, containers=daemons.running, stop=stop, outside=daemons.outside),
            [alpha],
            why="test",
        )
    assert seen[0] is not None and seen[0].startswith("test (at most until ") and seen[1:] == [None, None]


def test_emptying_lists_again_until_nothing_runs(box: Machine, repos: tuple[Repo, Repo]) -> None:
    """A container started just before the drain mark shows only in the next listing."""
    alpha, _ = repos
    daemons = Daemons(box, container(alpha, "first"))
    late = container(alpha, "late")

    def stop(holder: Holder) -> None:
        daemons.stop(holder)
        if holder.name == "first":
            daemons.containers.append(late)

    with state_lock(box):
        emptied = empty_repos(
            box,
            Holdings(box, containers=daemons.running, stop=stop, outside=daemons.outside),
            [alpha],
            why="t",
        )
    assert [h.name for h in emptied.stopped] == ["first", "late"]


def test_a_repo_that_cannot_be_emptied_keeps_the_revocation_and_residue_and_lifts_the_drain(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, _ = repos
    stuck = container(alpha, "stuck")
    clock = itertools.count(0.0, 100.0)  # each look at the clock: 100 s later
    holdings = Holdings(box, containers=lambda repo: [stuck], stop=lambda h: None, outside=lambda repo: [])
    store = GrantStore(box, fake_plugins())
    store.grant(alpha, [f"{GPU}=0"])
    with state_lock(box), pytest.raises(StateError, match="could not empty repo alpha@box") as caught:
        removed = read_grants(box)
        empty_repos(box, holdings, [alpha], revoke=removed, why="t", clock=lambda: next(clock))
    assert "`rdc repo down alpha@box`" in caught.value.todo
    assert read_grants(box) == [] and read_all(box).draining == ()
    assert [(r.repo_id, r.how) for r in residue(read_all(box))] == [(alpha.id, "revoked")]


def test_a_process_outside_any_container_refuses_with_repo_down(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    daemons = Daemons(box, container(alpha, "y"))
    daemons.escaped[alpha.id] = ["sleep (pid 42, in a container's mount namespace)"]
    store = GrantStore(box, fake_plugins(), running=daemons.holdings())
    store.grant(alpha, [f"{GPU}=0"])
    with pytest.raises(RefusedError, match="sleep \\(pid 42") as caught:
        store.grant(beta, [f"{GPU}=0"], exclusive=True, take_over=True)
    assert "outside any container of alpha@box" in caught.value.what
    assert "`rdc repo down alpha@box`" in caught.value.todo
    assert read_grants(box) == [] and read_all(box).draining == ()  # taken, not granted


def test_residue_refuses_an_exclusive_grant_while_the_old_repo_runs_anything(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    daemons = Daemons(box, container(alpha, "y"))
    store = GrantStore(box, fake_plugins(), running=daemons.holdings())
    store.grant(alpha, [f"{GPU}=all"])
    store.revoke(alpha, [f"{GPU}=all"])  # without --stop: y may hold it in flight
    with pytest.raises(RefusedError) as caught:
        store.grant(beta, [f"{GPU}=0"], exclusive=True)  # `all` reaches card 0
    assert f"repo alpha@box held {GPU}=all until " in caught.value.what
    assert "(revoked) and still runs container y (running)" in caught.value.what
    assert "--stop-holders" in caught.value.todo and "`rdc repo down alpha@box`" in caught.value.todo
    store.grant(beta, [f"{GPU}=1"], exclusive=True)  # other hardware: not in the way
    (outcome,) = store.grant(beta, [f"{GPU}=0"], exclusive=True, stop_holders=True)
    assert [h.name for h in outcome.stopped] == ["y"] and residue(read_all(box)) == []


def test_residue_of_a_repo_that_runs_nothing_is_cleared_at_the_check(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    store = GrantStore(box, fake_plugins(), running=Daemons(box).holdings())
    store.grant(alpha, [f"{GPU}=0"])
    store.revoke(alpha, [f"{GPU}=0"])
    assert len(residue(read_all(box))) == 1
    store.grant(beta, [f"{GPU}=0"], exclusive=True)
    assert residue(read_all(box)) == []


def test_an_ended_lease_is_residue_until_the_repo_runs_nothing(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    from rediacc_core.grants.records import write_grants

    with state_lock(box):
        write_grants(
            box, [Grant(alpha.id, f"{GPU}=0", False, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")]
        )
    daemons = Daemons(box, container(alpha, "y"))
    store = GrantStore(box, fake_plugins(), running=daemons.holdings())
    store.grant(beta, [f"{GPU}=1"])  # a write drops the ended lease, and keeps it as residue
    assert [(r.device, r.how, r.ended) for r in residue(read_all(box))] == [
        (f"{GPU}=0", "lease-end", "2026-01-01T01:00:00Z")
    ]
    with pytest.raises(RefusedError, match="\\(lease-end\\) and still runs container y"):
        store.grant(beta, [f"{GPU}=0"], exclusive=True)


def test_a_take_over_names_every_grant_it_would_revoke_and_revokes_no_other(
    box: Machine, repos: tuple[Repo, Repo]
) -> None:
    alpha, beta = repos
    gamma = RepoStore(box).create("gamma")
    store = GrantStore(box, fake_plugins(), running=Daemons(box).holdings())
    store.grant(alpha, [f"{GPU}=0"])
    store.grant(gamma, [f"{GPU}=all"])  # a third repo's shared grant of the same hardware
    plan = store.take_over_plan(beta, [f"{GPU}=0"])
    assert sorted((who, g.device) for who, g in plan) == [
        ("alpha@box", f"{GPU}=0"),
        ("gamma@box", f"{GPU}=all"),
    ]
    advice = store.in_the_way(beta, f"{GPU}=0")
    assert advice is None  # shared: nothing is in the way of a shared grant
    listed = {(alpha.id, f"{GPU}=0")}  # gamma's was not shown
    with pytest.raises(
        RefusedError, match=f"repo gamma@box holds {GPU}=all, which the take-over did not list"
    ):
        store.grant(beta, [f"{GPU}=0"], exclusive=True, take_over=True, listed=listed)
    assert len(read_grants(box)) == 2  # nothing revoked
    store.grant(
        beta, [f"{GPU}=0"], exclusive=True, take_over=True, listed={(g.repo_id, g.device) for _, g in plan}
    )
    assert [(g.repo_id, g.device) for g in read_grants(box)] == [(beta.id, f"{GPU}=0")]


def test_the_take_over_advice_names_every_repo_in_the_way(box: Machine, repos: tuple[Repo, Repo]) -> None:
    """beta's container holds the whole card 0: alpha's exclusive slice of it blocks it; the exclusive
    take-over advised would also revoke gamma's shared other slice, so the advice names it too."""
    alpha, beta = repos
    gamma = RepoStore(box).create("gamma")
    store = GrantStore(box, fake_plugins(), running=Daemons(box).holdings())
    store.grant(alpha, [f"{GPU}=mig-0-1"], exclusive=True)
    store.grant(gamma, [f"{GPU}=mig-0-2"])
    advice = store.in_the_way(beta, f"{GPU}=0") or ""
    assert f"revokes {GPU}=mig-0-1 of repo alpha@box; {GPU}=mig-0-2 of repo gamma@box" in advice
    assert "rdc repo gpu revoke gamma@box" in advice
