"""Grants bound to hardware: each grant records what its name reached, setup's re-check suspends a
grant whose name vanished, moved to other hardware or overlaps another repo's exclusive reservation,
and `confirm` (or a revoke) resolves it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from grants_kit import BUS_A, BUS_B, GPU, build_machine, fake_plugins, set_uuids

from rediacc_core.bindings import MOVED, OVERLAP, VANISHED, UnitIdentity
from rediacc_core.errors import RefusedError
from rediacc_core.gate.audit.read import read_entries
from rediacc_core.grants.live import LiveGrants
from rediacc_core.grants.records import read_grants, write_grants
from rediacc_core.grants.store import GrantStore
from rediacc_core.machine import Machine
from rediacc_core.plugins import Plugins
from rediacc_core.recheck import BOUND, CONFIRMED, RESUMED, SUSPENDED, confirm_grants, recheck_grants
from rediacc_core.repos import Repo, RepoStore, audit_log_path
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.statelock import state_lock
from rediacc_core.testing import FakeMachine


def drop_from_spec(box: Machine, name: str) -> None:
    """The spec no longer defines `name` (the card is gone): its entry is renamed away."""
    spec = box.cdi_dir / "vendor-example.yaml"
    spec.write_text(spec.read_text().replace(f'- name: "{name}"', f'- name: "gone-{name}"'))


@pytest.fixture
def box(make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    machine = build_machine(make_fake_machine("box"))
    set_uuids(machine, "GPU-a", "GPU-b")
    return machine


@pytest.fixture
def plugins() -> Plugins:
    return fake_plugins()


@pytest.fixture
def store(box: Machine, plugins: Plugins) -> GrantStore:
    return GrantStore(box, plugins, running=Holdings(box))


@pytest.fixture
def alpha(box: Machine) -> Repo:
    return RepoStore(box).create("alpha")


@pytest.fixture
def beta(box: Machine) -> Repo:
    return RepoStore(box).create("beta")


def audit_lines(box: Machine, repo: Repo) -> list[dict[str, Any]]:
    return list(read_entries(audit_log_path(box, repo.id)))


def test_a_grant_records_the_hardware_its_name_reaches(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0", f"{GPU}=mig-0-1"])
    card, mig = sorted(read_grants(store.machine), key=lambda g: g.device)
    assert card.bound_to == (UnitIdentity(f"pci:{BUS_A}", BUS_A, "GPU-a"),)
    assert mig.bound_to == (
        UnitIdentity(
            f"pci:{BUS_A}/mig:1",
            BUS_A,
            "MIG-1",
            "GPU-a",
            (("computeInstanceId", 0), ("gpuInstanceId", 1)),
        ),
    )
    recorded = json.loads(store.machine.grants_path.read_text())["grants"][0]
    assert recorded["boundTo"] == [{"unit": f"pci:{BUS_A}", "pciBusId": BUS_A, "uuid": "GPU-a"}]
    assert "suspended" not in recorded


def test_a_recheck_of_unchanged_facts_changes_nothing(
    store: GrantStore, plugins: Plugins, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    before = store.machine.grants_path.read_text()
    assert recheck_grants(store.machine, plugins) == []
    assert store.machine.grants_path.read_text() == before


def test_a_card_swap_suspends_the_grant_until_confirmed(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    set_uuids(box, "GPU-b", "GPU-a")  # the cards exchanged slots: index 0 is the other card now
    (change,) = recheck_grants(box, plugins)
    assert change.what == SUSPENDED and change.repo_ref == "alpha@box"
    held = change.grant.suspended
    assert held is not None and held.reason == MOVED
    assert held.drift == f"it was granted on GPU-a at {BUS_A} and now reaches GPU-b at {BUS_A}"
    # Reaches nothing: the gate's reading leaves it out; listings and the reservation keep it.
    assert LiveGrants(box).for_repo(alpha.id) == frozenset()
    assert [g.device for g in read_grants(box)] == [f"{GPU}=0"]
    (line,) = audit_lines(box, alpha)
    assert line["decision"] == "suspended" and line["cdi_asked"] == [f"{GPU}=0"]
    assert "GPU-b" in line["message"]
    # A second setup on the same facts keeps it suspended, since it was first seen.
    assert recheck_grants(box, plugins) == []
    (confirmed,) = confirm_grants(box, plugins, alpha, [f"{GPU}=0"])
    assert confirmed.what == CONFIRMED and confirmed.grant.suspended is None
    assert confirmed.grant.bound_to == (UnitIdentity(f"pci:{BUS_A}", BUS_A, "GPU-b"),)
    assert LiveGrants(box).for_repo(alpha.id) == {f"{GPU}=0"}
    assert audit_lines(box, alpha)[-1]["decision"] == "confirmed"


def test_a_name_that_follows_its_card_is_not_moved(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=GPU-aaaa"])  # a uuid-form name: the card wherever it sits
    document = json.loads(box.inventory_path.read_text())
    first, second = document["gpus"]
    first["pciBusId"], second["pciBusId"] = BUS_B, BUS_A  # same card, other slot
    box.inventory_path.write_text(json.dumps(document))
    assert recheck_grants(box, plugins) == []


def test_granting_a_suspended_name_again_says_how_to_resolve_it(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    set_uuids(box, "GPU-b", "GPU-a")
    recheck_grants(box, plugins)
    (again,) = store.grant(alpha, [f"{GPU}=0"])
    assert not again.changed and again.grant.suspended is not None  # a grant does not lift it
    assert again.note.startswith("already granted, but suspended (it was granted on GPU-a")
    assert f"`rdc repo gpu confirm alpha@box --device {GPU}=0`" in again.note


def test_cards_back_in_place_lift_the_suspension(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=1"])
    set_uuids(box, "GPU-b", "GPU-a")
    assert [c.what for c in recheck_grants(box, plugins)] == [SUSPENDED]
    set_uuids(box, "GPU-a", "GPU-b")
    (change,) = recheck_grants(box, plugins)
    assert change.what == RESUMED and change.grant.suspended is None
    assert LiveGrants(box).for_repo(alpha.id) == {f"{GPU}=1"}


def test_a_vanished_name_suspends_and_cannot_be_confirmed(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=1"])
    drop_from_spec(box, "1")
    (change,) = recheck_grants(box, plugins)
    assert change.grant.suspended is not None and change.grant.suspended.reason == VANISHED
    assert f"defines {GPU}=1 any more" in change.grant.suspended.drift
    with pytest.raises(RefusedError) as refused:
        confirm_grants(box, plugins, alpha, [f"{GPU}=1"])
    assert f"rdc repo gpu revoke alpha@box --device {GPU}=1" in (refused.value.todo or "")
    # A revoke clears it.
    store.revoke(alpha, [f"{GPU}=1"], absent_ok=True)
    assert read_grants(box) == []


def overlap_by_hand(box: Machine, store: GrantStore, alpha: Repo, beta: Repo) -> None:
    """alpha holds card 0 exclusively, and beta a slice of it exclusively, granted later: what an
    earlier setup that lost the slices let through (the grant check refuses it today)."""
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    with state_lock(box):
        (first,) = read_grants(box)
        later = type(first)(beta.id, f"{GPU}=mig-0-1", True, "2099-01-01T00:00:00Z")
        write_grants(box, [first, later])


def test_an_overlap_of_exclusive_reservations_suspends_the_later_grant(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo, beta: Repo
) -> None:
    overlap_by_hand(box, store, alpha, beta)
    changes = recheck_grants(box, plugins)
    assert [(c.what, c.repo_ref) for c in changes] == [(SUSPENDED, "beta@box")]
    held = changes[0].grant.suspended
    assert held is not None and held.reason == OVERLAP
    assert (
        held.drift
        == f"repo alpha@box holds {GPU}=0 exclusively, which reaches the same hardware (pci:{BUS_A})"
    )
    assert LiveGrants(box).for_repo(beta.id) == frozenset()
    assert LiveGrants(box).for_repo(alpha.id) == {f"{GPU}=0"}


def test_confirm_is_refused_while_it_would_overlap_and_allowed_after_the_revoke(
    store: GrantStore, plugins: Plugins, box: Machine, alpha: Repo, beta: Repo
) -> None:
    overlap_by_hand(box, store, alpha, beta)
    recheck_grants(box, plugins)
    with pytest.raises(RefusedError) as refused:
        confirm_grants(box, plugins, beta, [f"{GPU}=mig-0-1"])
    assert f"repo alpha@box holds {GPU}=0 exclusively" in refused.value.what
    assert f"`rdc repo gpu revoke alpha@box --device {GPU}=0`" in (refused.value.todo or "")
    assert LiveGrants(box).for_repo(beta.id) == frozenset()  # nothing was confirmed
    store.revoke(alpha, [f"{GPU}=0"])
    (change,) = confirm_grants(box, plugins, beta, [f"{GPU}=mig-0-1"])
    assert change.grant.suspended is None


def test_an_older_grants_file_loads_and_is_bound_at_the_next_recheck(
    box: Machine, plugins: Plugins, alpha: Repo
) -> None:
    old = {
        "schemaVersion": 1,
        "grants": [{"repoId": alpha.id, "device": f"{GPU}=1", "exclusive": False, "grantedAt": "x"}],
    }
    box.grants_path.write_text(json.dumps(old))
    (grant,) = read_grants(box)
    assert grant.bound_to is None and grant.suspended is None
    assert LiveGrants(box).for_repo(alpha.id) == {f"{GPU}=1"}  # an unbound grant is in force
    (change,) = recheck_grants(box, plugins)
    assert change.what == BOUND
    assert change.grant.bound_to == (UnitIdentity(f"pci:{BUS_B}", BUS_B, "GPU-b"),)
    assert audit_lines(box, alpha) == []  # nothing changed for the repo
