"""GPU grants: exact CDI names per repo identity, checked against the machine's specs, with exclusive
reservations that follow the hardware, all under one machine-wide lock."""

from __future__ import annotations

import json
import multiprocessing
import os
from collections.abc import Callable, Collection
from dataclasses import replace
from multiprocessing.synchronize import Barrier, Event

import pytest
from grants_kit import GPU, RENDER, build_machine, fake_plugins

from rediacc_core.bindings import units_overlap
from rediacc_core.errors import (
    EXIT_BUSY,
    EXIT_NOT_FOUND,
    EXIT_REFUSED,
    EXIT_VALIDATION,
    BusyError,
    NotFoundError,
    RdcError,
    RefusedError,
    ValidationError,
)
from rediacc_core.files import schema_errors
from rediacc_core.grants.live import LiveGrants
from rediacc_core.grants.records import delete_repo, prune_orphans, read_grants
from rediacc_core.grants.store import GrantStore
from rediacc_core.machine import Machine
from rediacc_core.plugins import Plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.holdings import Holder, Holdings
from rediacc_core.runtime.openers import Opener
from rediacc_core.statelock import lock_timeout, state_lock
from rediacc_core.testing import FakeMachine

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def box(make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    return build_machine(make_fake_machine("box"))


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


def devices_of(store: GrantStore, repo: Repo) -> list[tuple[str, bool]]:
    return [(g.device, g.exclusive) for g in store.for_repo(repo.id)]


# --- what a grant is -------------------------------------------------------------------------------


def test_a_grant_records_one_exact_name_for_the_repo_identity(store: GrantStore, alpha: Repo) -> None:
    [outcome] = store.grant(alpha, [f"{GPU}=all"])
    assert outcome.changed and outcome.grant.repo_id == alpha.id
    assert devices_of(store, alpha) == [(f"{GPU}=all", False)]
    document = json.loads(store.machine.grants_path.read_text())
    assert schema_errors(document, "grants.schema.json") == []


def test_granting_all_admits_all_and_never_a_single_card(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=all"])
    live = LiveGrants(store.machine)
    assert live.for_repo(alpha.id) == {f"{GPU}=all"}
    assert f"{GPU}=0" not in live.for_repo(alpha.id)


def test_granting_one_card_admits_that_card_only(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    assert LiveGrants(store.machine).for_repo(alpha.id) == {f"{GPU}=0"}


def test_granting_again_changes_nothing(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    before = store.machine.grants_path.read_bytes()
    [outcome] = store.grant(alpha, [f"{GPU}=0"])
    assert not outcome.changed
    assert store.machine.grants_path.read_bytes() == before


# --- names are checked against the machine's specs when written ---------------------------------------


def test_a_mistyped_name_is_refused_with_the_nearest_names_and_nothing_recorded(
    store: GrantStore, alpha: Repo
) -> None:
    with pytest.raises(ValidationError) as caught:
        store.grant(alpha, [f"{GPU}=al"])
    assert caught.value.exit_code == EXIT_VALIDATION
    assert f"{GPU}=al is not defined" in caught.value.what
    assert f"did you mean {GPU}=all" in caught.value.what
    assert read_grants(store.machine) == []


def test_a_mistyped_vendor_is_refused_too(store: GrantStore, alpha: Repo) -> None:
    with pytest.raises(ValidationError, match=r"vendor\.example/gpu=0") as caught:
        store.grant(alpha, ["vendor.exmaple/gpu=0"])
    assert "did you mean" in caught.value.what
    assert not store.machine.grants_path.exists()


@pytest.mark.parametrize(
    ("name", "part"),
    [
        ("vendor.example/gpu", 'missing "="'),
        ("vendor.example=0", 'missing "/"'),
        ("vendor.example/gpu=", "empty device name"),
        ("vendor example/gpu=0", "invalid vendor"),
        ("/dev/fakegpu0", "is a path"),
    ],
)
def test_a_malformed_name_is_refused_naming_the_bad_part(
    store: GrantStore, alpha: Repo, name: str, part: str
) -> None:
    with pytest.raises(ValidationError, match=part) as caught:
        store.grant(alpha, [name])
    assert caught.value.exit_code == EXIT_VALIDATION
    assert not store.machine.grants_path.exists()


def test_several_devices_are_all_or_nothing(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=1"])
    before = store.machine.grants_path.read_bytes()
    with pytest.raises(ValidationError) as caught:
        store.grant(alpha, [f"{GPU}=0", f"{GPU}=9", f"{RENDER}=renderD12"])
    # Every bad name is reported at once, so one retry can fix them all.
    assert f"{GPU}=9" in caught.value.what and f"{RENDER}=renderD12" in caught.value.what
    assert store.machine.grants_path.read_bytes() == before
    outcomes = store.grant(alpha, [f"{GPU}=0", f"{RENDER}=renderD128"])
    assert [o.changed for o in outcomes] == [True, True]
    assert devices_of(store, alpha) == [
        (f"{RENDER}=renderD128", False),
        (f"{GPU}=0", False),
        (f"{GPU}=1", False),
    ]


def test_a_machine_without_specs_says_to_run_setup(
    make_fake_machine: Callable[[str], FakeMachine], plugins: Plugins
) -> None:
    bare = make_fake_machine("bare").machine
    repo = RepoStore(bare).create("alpha")
    with pytest.raises(ValidationError) as caught:
        GrantStore(bare, plugins, running=Holdings(bare)).grant(repo, [f"{GPU}=0"])
    assert "rdc machine setup bare" in caught.value.todo


def test_a_grant_for_a_deleted_repo_is_refused(store: GrantStore, box: Machine, alpha: Repo) -> None:
    delete_repo(box, alpha)
    with pytest.raises(NotFoundError):
        store.grant(alpha, [f"{GPU}=0"])
    assert read_grants(box) == []


# --- exclusive grants ---------------------------------------------------------------------------------


def test_an_exclusive_grant_is_refused_when_another_repo_holds_the_name(
    store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    store.grant(beta, [f"{GPU}=0"])
    with pytest.raises(RefusedError) as caught:
        store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    assert caught.value.exit_code == EXIT_REFUSED
    assert f"repo beta@box holds {GPU}=0" in caught.value.what
    assert f"rdc repo gpu revoke beta@box --device {GPU}=0" in caught.value.todo
    assert f"`rdc repo gpu grant alpha@box --device {GPU}=0 --exclusive --take-over`" in caught.value.todo
    assert devices_of(store, alpha) == []


def test_while_exclusive_no_other_repo_may_have_the_name_even_shared(
    store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    with pytest.raises(RefusedError) as caught:
        store.grant(beta, [f"{GPU}=0"])
    assert f"repo alpha@box holds {GPU}=0 exclusively" in caught.value.what
    assert devices_of(store, beta) == []


def test_shared_grants_of_one_name_to_several_repos_are_fine(
    store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    store.grant(beta, [f"{GPU}=0"])
    assert devices_of(store, alpha) == devices_of(store, beta) == [(f"{GPU}=0", False)]


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        (f"{GPU}=all", f"{GPU}=0"),  # all reaches every card
        (f"{GPU}=0", f"{GPU}=all"),
        (f"{GPU}=GPU-aaaa", f"{GPU}=0"),  # a uuid and an index naming the same card
        (f"{GPU}=0", f"{GPU}=mig-0-1"),  # a slice is part of its card
        (f"{GPU}=mig-0-2", f"{GPU}=all"),
        (f"{RENDER}=renderD128", f"{GPU}=0"),  # another plugin's name for the same card
    ],
)
def test_exclusivity_follows_the_hardware_not_just_the_name(
    store: GrantStore, alpha: Repo, beta: Repo, held: str, wanted: str
) -> None:
    store.grant(beta, [held], exclusive=True)
    with pytest.raises(RefusedError) as caught:
        store.grant(alpha, [wanted])
    assert (
        f"repo beta@box holds {held} exclusively, which reaches the same hardware as {wanted}"
        in caught.value.what
    )
    # ... in both directions: a shared grant in the way blocks a new exclusive one.
    store.revoke(beta, [held])
    store.grant(beta, [held])
    with pytest.raises(RefusedError):
        store.grant(alpha, [wanted], exclusive=True)
    assert devices_of(store, alpha) == []


@pytest.mark.parametrize(
    ("held", "wanted"),
    [
        (f"{GPU}=0", f"{GPU}=1"),
        (f"{GPU}=mig-0-1", f"{GPU}=mig-0-2"),  # two slices of one card are separate hardware
        (f"{RENDER}=renderD129", f"{GPU}=0"),
        (f"{GPU}=nounits", f"{GPU}=2"),  # names reaching no known hardware conflict only by name
    ],
)
def test_exclusive_grants_of_separate_hardware_do_not_conflict(
    store: GrantStore, alpha: Repo, beta: Repo, held: str, wanted: str
) -> None:
    store.grant(beta, [held], exclusive=True)
    store.grant(alpha, [wanted], exclusive=True)
    assert devices_of(store, alpha) == [(wanted, True)]


def test_a_name_reaching_no_known_hardware_still_conflicts_by_name(
    store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    store.grant(beta, [f"{GPU}=nounits"], exclusive=True)
    with pytest.raises(RefusedError):
        store.grant(alpha, [f"{GPU}=nounits"])


def test_a_repo_never_blocks_itself(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    store.grant(alpha, [f"{GPU}=all", f"{GPU}=mig-0-1"], exclusive=True)
    assert {d for d, _ in devices_of(store, alpha)} == {f"{GPU}=0", f"{GPU}=all", f"{GPU}=mig-0-1"}


def test_an_exclusive_refusal_is_all_or_nothing(store: GrantStore, alpha: Repo, beta: Repo) -> None:
    store.grant(beta, [f"{GPU}=1"], exclusive=True)
    with pytest.raises(RefusedError):
        store.grant(alpha, [f"{GPU}=0", f"{GPU}=1"])
    assert devices_of(store, alpha) == []


def test_a_shared_grant_can_become_exclusive_but_a_plain_grant_never_loosens_one(
    store: GrantStore, alpha: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    [up] = store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    assert up.changed and up.grant.exclusive
    [same] = store.grant(alpha, [f"{GPU}=0"])
    assert not same.changed and "exclusively" in same.note
    assert devices_of(store, alpha) == [(f"{GPU}=0", True)]


def test_a_corrupt_inventory_stops_an_exclusive_check_that_needs_it(
    store: GrantStore, box: Machine, alpha: Repo, beta: Repo
) -> None:
    store.grant(beta, [f"{GPU}=all"])
    box.inventory_path.write_text("{broken")
    with pytest.raises(ValidationError, match="inventory"):
        store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    assert devices_of(store, alpha) == []


# --- revoke, fork, delete, re-create -------------------------------------------------------------------


def test_revoke_removes_exactly_the_named_grants(store: GrantStore, alpha: Repo, beta: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0", f"{GPU}=1"])
    store.grant(beta, [f"{GPU}=0"])
    removed = store.revoke(alpha, [f"{GPU}=0"])
    assert [g.device for g in removed] == [f"{GPU}=0"]
    assert devices_of(store, alpha) == [(f"{GPU}=1", False)]
    assert devices_of(store, beta) == [(f"{GPU}=0", False)]


def test_revoking_a_grant_not_held_is_not_found_and_changes_nothing(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    before = store.machine.grants_path.read_bytes()
    with pytest.raises(NotFoundError) as caught:
        store.revoke(alpha, [f"{GPU}=0", f"{GPU}=al"])
    assert caught.value.exit_code == EXIT_NOT_FOUND
    assert f"{GPU}=al" in caught.value.what and f"{GPU}=0" in caught.value.todo
    assert store.machine.grants_path.read_bytes() == before


def test_a_revoke_that_may_find_the_grant_gone_still_refuses_an_unknown_name(
    store: GrantStore, alpha: Repo
) -> None:
    """`revoke --stop` rerun after the grant went (its holders are what it is for): a name the specs
    define is no error, a typo still is."""
    store.grant(alpha, [f"{GPU}=0"])
    assert [g.device for g in store.revoke(alpha, [f"{GPU}=0", f"{GPU}=1"], absent_ok=True)] == [f"{GPU}=0"]
    assert store.revoke(alpha, [f"{GPU}=0"], absent_ok=True) == []
    with pytest.raises(NotFoundError, match=f"{GPU}=al"):
        store.revoke(alpha, [f"{GPU}=al"], absent_ok=True)


def test_revoking_frees_an_exclusive_reservation(store: GrantStore, alpha: Repo, beta: Repo) -> None:
    store.grant(alpha, [f"{GPU}=all"], exclusive=True)
    store.revoke(alpha, [f"{GPU}=all"])
    store.grant(beta, [f"{GPU}=0"], exclusive=True)


def test_a_fork_starts_without_the_origins_grants(store: GrantStore, box: Machine, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    fork = RepoStore(box).fork(alpha, "exp")
    assert store.for_repo(fork.id) == []
    assert LiveGrants(box).for_repo(fork.id) == frozenset()


def test_deleting_a_repo_deletes_its_grants_and_a_re_created_one_has_none(
    store: GrantStore, box: Machine, alpha: Repo, beta: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0", f"{GPU}=1"], exclusive=True)
    store.grant(beta, [f"{GPU}=2"])
    assert delete_repo(box, alpha) == 2
    assert {g.repo_id for g in read_grants(box)} == {beta.id}
    again = RepoStore(box).create("alpha")
    assert store.for_repo(again.id) == []
    store.grant(beta, [f"{GPU}=0"], exclusive=True)  # the deleted repo's reservation went with it


# --- the grants file ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        "",
        "{not json",
        json.dumps({"schemaVersion": 1, "grants": [{"repoId": "x", "device": "v/c=0"}]}),
        json.dumps({"schemaVersion": 1}),
        json.dumps([]),
    ],
)
def test_a_corrupt_grants_file_is_an_error_naming_it_never_no_grants(
    store: GrantStore, alpha: Repo, content: str
) -> None:
    path = store.machine.grants_path
    path.write_text(content)
    with pytest.raises(ValidationError) as caught:
        store.all()
    assert str(path) in caught.value.what
    with pytest.raises(ValidationError):
        LiveGrants(store.machine).for_repo(alpha.id)
    # Writing is refused too: a reset would silently drop every grant on the machine.
    with pytest.raises(ValidationError):
        store.grant(alpha, [f"{GPU}=0"])
    with pytest.raises(ValidationError):
        store.revoke(alpha, [f"{GPU}=0"])
    with pytest.raises(ValidationError):
        delete_repo(store.machine, alpha)
    assert RepoStore(store.machine).by_id(alpha.id) == alpha
    assert path.read_text() == content


def test_a_grants_file_granting_one_name_twice_to_a_repo_is_corrupt(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    path = store.machine.grants_path
    document = json.loads(path.read_text())
    document["grants"] *= 2
    path.write_text(json.dumps(document))
    with pytest.raises(ValidationError, match="more than once"):
        store.all()


@pytest.mark.parametrize("second_exclusive", [True, False])
def test_a_grants_file_giving_an_exclusive_device_to_a_second_repo_is_corrupt(
    store: GrantStore, alpha: Repo, beta: Repo, second_exclusive: bool
) -> None:
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    path = store.machine.grants_path
    document = json.loads(path.read_text())
    document["grants"].append({**document["grants"][0], "repoId": beta.id, "exclusive": second_exclusive})
    path.write_text(json.dumps(document))  # a hand edit: `grant` itself refuses this

    with pytest.raises(ValidationError, match="holds it exclusively") as caught:
        store.all()
    assert str(path) in caught.value.what
    with pytest.raises(ValidationError, match="holds it exclusively"):
        LiveGrants(store.machine).for_repo(beta.id)  # the gate fails closed


def test_prune_removes_only_the_grants_of_repos_that_no_longer_exist(
    store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)
    store.grant(beta, [f"{GPU}=1"])
    repos_path = store.machine.repos_path
    document = json.loads(repos_path.read_text())
    document["repos"] = [r for r in document["repos"] if r["id"] != alpha.id]
    repos_path.write_text(json.dumps(document))  # alpha deleted by hand: its exclusive grant stayed

    gone = prune_orphans(store.machine)

    assert [(g.repo_id, g.device) for g in gone] == [(alpha.id, f"{GPU}=0")]
    assert [(g.repo_id, g.device) for g in store.all()] == [(beta.id, f"{GPU}=1")]
    assert prune_orphans(store.machine) == []


def test_an_unreadable_grants_file_is_an_error(store: GrantStore, alpha: Repo) -> None:
    store.machine.grants_path.mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(ValidationError, match="cannot read grants file"):
        store.all()
    with pytest.raises(ValidationError, match="cannot read grants file"):
        LiveGrants(store.machine).for_repo(alpha.id)


def test_no_grants_file_means_nothing_was_ever_granted(store: GrantStore, alpha: Repo) -> None:
    assert store.all() == []
    assert LiveGrants(store.machine).for_repo(alpha.id) == frozenset()


# --- live reading for the gate ------------------------------------------------------------------------


def test_live_grants_re_read_only_when_the_file_changed(store: GrantStore, alpha: Repo, beta: Repo) -> None:
    live = LiveGrants(store.machine)
    assert live.for_repo(alpha.id) == frozenset() and live.reads == 0  # no file: nothing to parse
    store.grant(alpha, [f"{GPU}=0"])
    assert live.for_repo(alpha.id) == {f"{GPU}=0"}
    for _ in range(5):
        assert live.for_repo(alpha.id) == {f"{GPU}=0"}
    assert live.reads == 1
    key = live.cache_key
    store.grant(beta, [f"{GPU}=1"])  # another repo's grant changes the file too
    assert live.for_repo(beta.id) == {f"{GPU}=1"}
    assert live.reads == 2 and live.cache_key != key
    store.revoke(alpha, [f"{GPU}=0"])
    assert live.for_repo(alpha.id) == frozenset() and live.reads == 3


def test_every_write_gives_the_file_a_new_cache_key(store: GrantStore, alpha: Repo) -> None:
    # Quick successive writes may reuse a freed inode within one clock tick; the key must still change.
    live = LiveGrants(store.machine)
    keys = set()
    for _ in range(10):
        store.grant(alpha, [f"{GPU}=0"])
        live.grants()
        keys.add(live.cache_key)
        store.revoke(alpha, [f"{GPU}=0"])
        live.grants()
        keys.add(live.cache_key)
    assert len(keys) == 20


def test_live_grants_fail_closed_on_corruption_and_recover_when_fixed(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    live = LiveGrants(store.machine)
    assert live.for_repo(alpha.id) == {f"{GPU}=0"}
    good = store.machine.grants_path.read_text()
    store.machine.grants_path.write_text("{")
    for _ in range(2):
        with pytest.raises(ValidationError, match="grants file"):
            live.for_repo(alpha.id)
    store.machine.grants_path.write_text(good)
    assert live.for_repo(alpha.id) == {f"{GPU}=0"}


def test_live_grants_notice_a_deleted_file(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"])
    live = LiveGrants(store.machine)
    assert live.for_repo(alpha.id)
    store.machine.grants_path.unlink()
    assert live.for_repo(alpha.id) == frozenset()


def test_unit_overlap_is_equality_or_ancestry() -> None:
    assert units_overlap("pci:x", "pci:x")
    assert units_overlap("pci:x", "pci:x/mig:1") and units_overlap("pci:x/mig:1", "pci:x")
    assert not units_overlap("pci:x/mig:1", "pci:x/mig:2")
    assert not units_overlap("pci:x", "pci:xy")  # a prefix that is not a path ancestor


# --- the lock, across processes ----------------------------------------------------------------------------


def _hold_lock(machine: Machine, held: Event, release: Event) -> None:
    with state_lock(machine):
        held.set()
        release.wait(30)


def test_a_held_lock_times_out_as_busy_naming_the_holder(
    store: GrantStore, alpha: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIACC_LOCK_TIMEOUT", "0.3")
    held, release = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_hold_lock, args=(store.machine, held, release))
    holder.start()
    try:
        assert held.wait(10)
        with pytest.raises(BusyError) as caught:
            store.grant(alpha, [f"{GPU}=0"])
        assert caught.value.exit_code == EXIT_BUSY
        assert f"process {holder.pid}" in caught.value.what
        assert read_grants(store.machine) == []
    finally:
        release.set()
        holder.join(10)
    store.grant(alpha, [f"{GPU}=0"])  # free again once the holder is gone


def _grant_in_child(machine: Machine, repo: Repo, device: str, exclusive: bool, start: Barrier) -> None:
    store = GrantStore(machine, fake_plugins(), lock_timeout=60, running=Holdings(machine))
    start.wait(30)
    try:
        store.grant(repo, [device], exclusive)
    except RdcError as exc:
        os._exit(exc.exit_code)
    os._exit(0)


def _race(machine: Machine, jobs: list[tuple[Repo, str, bool]]) -> list[int | None]:
    start = FORK.Barrier(len(jobs))
    children = [FORK.Process(target=_grant_in_child, args=(machine, *job, start)) for job in jobs]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    return [child.exitcode for child in children]


def test_many_processes_racing_for_one_exclusive_device_exactly_one_wins(box: Machine) -> None:
    repos = [RepoStore(box).create(f"r{i}") for i in range(8)]
    codes = _race(box, [(repo, f"{GPU}=0", True) for repo in repos])
    assert sorted(code or 0 for code in codes) == [0] + [EXIT_REFUSED] * 7
    assert None not in codes
    [grant] = read_grants(box)
    assert grant.exclusive and grant.repo_id == repos[codes.index(0)].id


def test_many_processes_granting_different_devices_at_once_lose_none(box: Machine) -> None:
    repo = RepoStore(box).create("alpha")
    devices = [f"{GPU}={i}" for i in range(8)]
    assert _race(box, [(repo, device, False) for device in devices]) == [0] * 8
    assert sorted(g.device for g in read_grants(box)) == sorted(devices)


def test_the_lock_file_and_pid_sidecar_live_beside_the_grants(box: Machine) -> None:
    with state_lock(box):
        assert (box.gpu_dir / "grants.lock.pid").read_text().strip() == str(os.getpid())
    assert (box.gpu_dir / "grants.lock").exists()
    assert not (box.gpu_dir / "grants.lock.pid").exists()


@pytest.mark.parametrize(
    ("raw", "seconds"), [(None, 10.0), ("0.5", 0.5), ("0", 0.0), ("soon", 10.0), ("-1", 10.0)]
)
def test_the_lock_wait_is_ten_seconds_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch, raw: str | None, seconds: float
) -> None:
    if raw is None:
        monkeypatch.delenv("REDIACC_LOCK_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("REDIACC_LOCK_TIMEOUT", raw)
    assert lock_timeout() == seconds


# --- leases ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "again", "says"),
    [
        (None, None, "already granted"),
        (
            "2030-01-01T00:00:00Z",
            "2031-01-01T00:00:00Z",
            "already granted until 2030-01-01T00:00:00Z, kept as it is (to end it at 2031-01-01T00:00:00Z: "
            "rdc repo gpu renew alpha@box --device vendor.example/gpu=0 --until 2031-01-01T00:00:00Z)",
        ),
        (
            "2030-01-01T00:00:00Z",
            None,
            "already granted until 2030-01-01T00:00:00Z, a lease kept as it is "
            "(no end: rdc repo gpu renew alpha@box --device vendor.example/gpu=0 --forever)",
        ),
        (
            None,
            "2031-01-01T00:00:00Z",
            "already granted with no end, kept as it is (to end it at 2031-01-01T00:00:00Z: "
            "rdc repo gpu renew alpha@box --device vendor.example/gpu=0 --until 2031-01-01T00:00:00Z)",
        ),
    ],
    ids=["same", "another-end", "lease-then-none", "none-then-lease"],
)
def test_granting_a_held_name_again_keeps_its_end_and_says_how_to_move_it(
    store: GrantStore, alpha: Repo, first: str | None, again: str | None, says: str
) -> None:
    store.grant(alpha, [f"{GPU}=0"], expires_at=first)
    (outcome,) = store.grant(alpha, [f"{GPU}=0"], expires_at=again)
    assert not outcome.changed and outcome.grant.expires_at == first
    assert outcome.note == says


def test_a_lease_is_absent_for_the_gate_from_its_end_on_without_a_write(
    store: GrantStore, alpha: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    import rediacc_core.grants.records as grants_module

    store.grant(alpha, [f"{GPU}=0"], expires_at="2030-01-01T00:00:00Z")
    live = LiveGrants(store.machine)
    monkeypatch.setattr(grants_module, "now_iso", lambda: "2029-12-31T23:59:59Z")
    assert live.for_repo(alpha.id) == {f"{GPU}=0"}
    monkeypatch.setattr(grants_module, "now_iso", lambda: "2030-01-01T00:00:00Z")
    assert live.for_repo(alpha.id) == frozenset()
    assert live.reads == 1  # the file did not change: the same parse, read against the clock


def test_a_write_after_the_end_drops_the_lease(store: GrantStore, alpha: Repo, beta: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"], expires_at="2030-01-01T00:00:00Z")
    assert read_grants(store.machine, now="2031-01-01T00:00:00Z") == []
    document = json.loads(store.machine.grants_path.read_text())
    document["grants"][0]["expiresAt"] = "2001-01-01T00:00:00Z"
    store.machine.grants_path.write_text(json.dumps(document))
    store.grant(beta, [f"{GPU}=1"])
    written = json.loads(store.machine.grants_path.read_text())["grants"]
    assert [g["repoId"] for g in written] == [beta.id]
    assert [g.repo_id for g in read_grants(store.machine)] == [beta.id]


def test_renew_moves_the_end_of_held_grants_only(store: GrantStore, alpha: Repo) -> None:
    store.grant(alpha, [f"{GPU}=0"], expires_at="2030-01-01T00:00:00Z")
    (renewed,) = store.renew(alpha, [f"{GPU}=0"], "2040-01-01T00:00:00Z")
    assert renewed.expires_at == "2040-01-01T00:00:00Z" and read_grants(store.machine) == [renewed]
    with pytest.raises(NotFoundError, match="nothing was renewed"):
        store.renew(alpha, [f"{GPU}=1"], "2040-01-01T00:00:00Z")


# --- exclusive grants and running holders ----------------------------------------------------------


def holder_of(repo: Repo, name: str, state: str, *cdi: str) -> Holder:
    return Holder(repo, f"{name}-id", name, state, tuple(cdi))


class Daemons:
    """The repos' containers as their daemons would answer: a stop makes one exited."""

    def __init__(self, *containers: Holder) -> None:
        self.containers = list(containers)
        self.stopped: list[Holder] = []

    def holders(self, repo: Repo) -> list[Holder]:
        return [h for h in self.containers if h.repo.id == repo.id]

    def stop(self, holder: Holder) -> None:
        self.stopped.append(holder)
        self.containers = [replace(h, state="exited") if h.id == holder.id else h for h in self.containers]


def test_an_exclusive_grant_waits_for_a_running_holder_in_another_repo(
    box: Machine, plugins: Plugins, alpha: Repo, beta: Repo
) -> None:
    daemons = Daemons(holder_of(alpha, "trainer", "running", f"{GPU}=all"))
    stopped = daemons.stopped
    store = GrantStore(box, plugins, running=Holdings(box, holders=daemons.holders, stop=daemons.stop))
    with pytest.raises(RefusedError, match="container trainer of repo alpha@box is running with") as caught:
        store.grant(beta, [f"{GPU}=0"], exclusive=True)  # `all` reaches card 0's hardware
    assert "--stop-holders" in caught.value.todo and "docker stop trainer" in caught.value.todo
    assert read_grants(box) == []
    store.grant(beta, [f"{GPU}=0"])  # shared grants do not wait
    (outcome,) = store.grant(beta, [f"{GPU}=0"], exclusive=True, stop_holders=True)
    assert [h.name for h in stopped] == ["trainer"] and outcome.stopped == tuple(stopped)
    assert read_grants(box)[0].exclusive


def test_take_over_is_a_handover_in_one_step(box: Machine, plugins: Plugins, alpha: Repo, beta: Repo) -> None:
    daemons = Daemons(holder_of(alpha, "trainer", "running", f"{GPU}=all"))
    stopped = daemons.stopped
    store = GrantStore(box, plugins, running=Holdings(box, holders=daemons.holders, stop=daemons.stop))
    store.grant(alpha, [f"{GPU}=all"], exclusive=True)  # reaches card 0's hardware too
    (outcome,) = store.grant(beta, [f"{GPU}=0"], exclusive=True, take_over=True)
    assert outcome.changed and outcome.taken == (("alpha@box", f"{GPU}=all"),)
    assert [h.name for h in stopped] == ["trainer"], "the old repo's holders are stopped in the same step"
    assert [(g.repo_id, g.device, g.exclusive) for g in read_grants(box)] == [(beta.id, f"{GPU}=0", True)]


@pytest.mark.parametrize(
    ("state", "held"), [("exited", f"{GPU}=0"), ("created", f"{GPU}=0"), ("running", f"{GPU}=1")]
)
def test_stopped_holders_and_other_hardware_are_not_in_the_way(
    box: Machine, plugins: Plugins, alpha: Repo, beta: Repo, state: str, held: str
) -> None:
    store = GrantStore(
        box, plugins, running=Holdings(box, holders=lambda repo: [holder_of(alpha, "c", state, held)])
    )
    store.grant(beta, [f"{GPU}=0"], exclusive=True)


def test_a_repo_never_waits_for_its_own_holders(box: Machine, plugins: Plugins, alpha: Repo) -> None:
    store = GrantStore(
        box,
        plugins,
        running=Holdings(box, holders=lambda repo: [holder_of(alpha, "mine", "running", f"{GPU}=0")]),
    )
    store.grant(alpha, [f"{GPU}=0"], exclusive=True)


# --- processes holding a node, whatever their container named --------------------------------------

FULL = ("c", 1, 7)
BOX_ID = "ab" * 32


def nodes_are_full(box: Machine, *indexes: int) -> None:
    """The host nodes of gpu=<index> become /dev/full (1:7), a node the kernel really has."""
    for index in indexes:
        node = box.path(f"/dev/fakegpu{index}")
        node.parent.mkdir(parents=True, exist_ok=True)
        node.unlink(missing_ok=True)
        node.symlink_to("/dev/full")


def opener(pid: int, container: str | None) -> Opener:
    return Opener(pid, f"sleep (pid {pid})", FULL, "fd 3 (/gpu0)", container)


def test_an_exclusive_grant_is_refused_while_a_process_of_another_repo_holds_the_node(
    box: Machine, plugins: Plugins, alpha: Repo, beta: Repo
) -> None:
    """No container of alpha names the device (its holder was stopped): one holds a descriptor of it."""
    nodes_are_full(box, 0)
    asked: list[tuple[str, set[tuple[str, int, int]]]] = []

    def find(repo: Repo, nodes: Collection[tuple[str, int, int]]) -> list[Opener]:
        asked.append((repo.name, set(nodes)))
        return [opener(4242, BOX_ID)] if repo.id == alpha.id else []

    store = GrantStore(
        box, plugins, running=Holdings(box, holders=lambda repo: [], stop=lambda h: None, openers=find)
    )
    with pytest.raises(RefusedError) as caught:
        store.grant(beta, [f"{GPU}=0"], exclusive=True)
    assert asked == [("alpha", {FULL})]  # every other repo, by the node's number
    assert "sleep (pid 4242) holds device c 1:7 as fd 3 (/gpu0), in container abababababab of alpha@box" in (
        caught.value.what
    )
    assert "docker stop abababababab" in caught.value.todo and "--stop-holders" in caught.value.todo
    assert read_grants(box) == []


def test_stop_holders_stops_the_container_of_a_process_holding_the_node(
    box: Machine, plugins: Plugins, alpha: Repo, beta: Repo
) -> None:
    nodes_are_full(box, 0)
    holding = [opener(4242, BOX_ID)]
    daemons = Daemons(Holder(alpha, BOX_ID, "keeper", "running", ()))

    def stop(holder: Holder) -> None:
        daemons.stop(holder)
        holding.clear()

    def find(repo: Repo, nodes: Collection[tuple[str, int, int]]) -> list[Opener]:
        return list(holding) if repo.id == alpha.id else []

    store = GrantStore(box, plugins, running=Holdings(box, holders=daemons.holders, stop=stop, openers=find))
    (outcome,) = store.grant(beta, [f"{GPU}=0"], exclusive=True, stop_holders=True)
    # The repo is emptied: its containers are stopped, whatever they name.
    assert [(h.id, h.repo.id) for h in daemons.stopped] == [(BOX_ID, alpha.id)]
    assert outcome.stopped == tuple(daemons.stopped)
    assert read_grants(box)[0].exclusive


def test_a_handover_is_refused_while_a_process_outside_any_container_holds_the_node(
    box: Machine, plugins: Plugins, alpha: Repo, beta: Repo
) -> None:
    """A process that left its container's cgroup survives `docker stop` with the device open."""
    nodes_are_full(box, 0)
    daemons = Daemons(holder_of(alpha, "trainer", "running", f"{GPU}=0"))
    store = GrantStore(
        box,
        plugins,
        running=Holdings(
            box,
            holders=daemons.holders,
            stop=daemons.stop,
            openers=lambda repo, nodes: [opener(4242, None)] if repo.id == alpha.id else [],
        ),
    )
    with pytest.raises(RefusedError, match="pid 4242") as caught:
        store.grant(beta, [f"{GPU}=0"], exclusive=True, stop_holders=True)
    assert "outside any container of alpha@box" in caught.value.what
    assert "`rdc repo down alpha@box`" in caught.value.todo
    assert read_grants(box) == []


def test_a_node_another_grant_of_that_repo_injects_too_does_not_count(
    box: Machine, plugins: Plugins, alpha: Repo, beta: Repo
) -> None:
    """A shared node (a control node every card's name injects) held by a repo granted another card."""
    nodes_are_full(box, 0, 1)
    asked: list[set[tuple[str, int, int]]] = []

    def find(repo: Repo, nodes: Collection[tuple[str, int, int]]) -> list[Opener]:
        asked.append(set(nodes))
        return []

    store = GrantStore(box, plugins, running=Holdings(box, holders=lambda repo: [], openers=find))
    store.grant(alpha, [f"{GPU}=1"])
    store.grant(beta, [f"{GPU}=0"], exclusive=True)
    assert asked == [set()]
