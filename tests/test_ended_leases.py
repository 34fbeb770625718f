"""An ended lease is named wherever a lease matters (a start, a renew, the GPU lists) for a day after
its end, even once a write has dropped its grant from the file; it grants nothing meanwhile, and a
grant of the same name again forgets it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rediacc_core.grants.records import Grant, ended_lease, read_all, read_grants, write_grants
from rediacc_core.machine import Machine
from rediacc_core.repos import RepoStore

GPU0, GPU1 = "vendor.example/gpu=0", "vendor.example/gpu=1"


def stamp(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def box(tmp_path: Path) -> Machine:
    machine = Machine("box", root=tmp_path / "m")
    machine.grants_path.parent.mkdir(parents=True)
    return machine


def test_a_lease_dropped_by_the_next_write_is_still_named_for_a_day(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    an_hour_ago = stamp(timedelta(hours=-1))
    write_grants(box, [Grant(repo.id, GPU0, False, stamp(timedelta(hours=-9)), an_hour_ago)])
    other = Grant(repo.id, GPU1, False, stamp(timedelta(0)))
    write_grants(box, [*read_grants(box), other])  # an unrelated change: the ended grant leaves the file

    assert [g.device for g in read_all(box).grants] == [GPU1]
    assert read_grants(box) == [other]  # it grants nothing
    lease = ended_lease(box, repo.id, GPU0)
    assert lease is not None and lease.expires_at == an_hour_ago
    assert ended_lease(box, repo.id, GPU0, now=stamp(timedelta(hours=22))) is not None
    assert ended_lease(box, repo.id, GPU0, now=stamp(timedelta(hours=24))) is None


def test_a_grant_of_the_same_name_again_forgets_the_ended_lease(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    write_grants(box, [Grant(repo.id, GPU0, False, stamp(timedelta(hours=-2)), stamp(timedelta(hours=-1)))])
    write_grants(box, [])
    assert ended_lease(box, repo.id, GPU0) is not None
    write_grants(box, [Grant(repo.id, GPU0, False, stamp(timedelta(0)))])
    assert ended_lease(box, repo.id, GPU0) is None
    assert read_all(box).ended == ()


def test_a_lease_that_ended_over_a_day_ago_is_not_carried_over(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    long_ago = stamp(timedelta(days=-3))
    write_grants(box, [Grant(repo.id, GPU0, False, stamp(timedelta(days=-4)), long_ago)])
    assert ended_lease(box, repo.id, GPU0) is not None  # still in the file: named until the next write
    write_grants(box, [])
    assert ended_lease(box, repo.id, GPU0) is None
