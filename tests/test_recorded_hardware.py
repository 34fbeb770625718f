"""A grant reaches the hardware it recorded, whoever wrote the facts: every writer of the inventory
(setup and `rdc machine refresh`) re-checks every grant, the gate and the runtime guard refuse a grant
whose recorded hardware is not what its name reaches in the inventory, `confirm` is refused onto a
card another repo's suspended exclusive grant still reserves, and the gate decides no device request
on an inventory older than the specs (`stale-facts`). No vendor plugin: a fake vendor whose two
cards can exchange slots."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from grants_kit import BUS_A, BUS_B, GPU, FakeVendor, build_machine
from hypothesis import given
from hypothesis import strategies as st

from rediacc_core import Gpu, GpuPartition, hookimpl
from rediacc_core.bindings import MOVED, UnitIdentity, drift
from rediacc_core.cli import cli
from rediacc_core.config import Config
from rediacc_core.errors import EXIT_REFUSED, RefusedError
from rediacc_core.gate.decide.containers import Container
from rediacc_core.gate.decide.decider import Decider, Decision
from rediacc_core.grants.live import LiveGrants
from rediacc_core.grants.records import Grant, read_grants, write_grants
from rediacc_core.grants.store import GrantStore
from rediacc_core.inventory import load_inventory, recorded_reaches
from rediacc_core.machine import Machine
from rediacc_core.plugins import LOAD_ENV, Plugins, load_plugins, set_plugins
from rediacc_core.recheck import SUSPENDED, confirm_grants
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime import guard
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.setup import SetupReport, run_setup
from rediacc_core.statelock import state_lock
from rediacc_core.testing import FakeMachine

GPU0, GPU1 = f"{GPU}=0", f"{GPU}=1"
SWAPPED = f"it was granted on GPU-a at {BUS_A} and now reaches GPU-b at {BUS_A}"


class SwappingVendor(FakeVendor):
    """Discovers two cards, at bus a (index 0) and bus b (index 1), with the uuids a test sets: a
    swap exchanges them behind the same indexes and buses."""

    def __init__(self) -> None:
        super().__init__()
        self.uuids = ("GPU-a", "GPU-b")

    @hookimpl
    def rdc_discover(self, machine: Machine) -> list[Gpu]:
        def card(index: int, bus: str, uuid: str, *parts: GpuPartition) -> Gpu:
            return Gpu(
                vendor="example",
                source="fakevendor",
                name=f"Card {index}",
                index=index,
                pci_bus_id=bus,
                cdi_names=(f"{GPU}={index}", f"{GPU}=all"),
                attributes={"uuid": uuid},
                partitions=parts,
            )

        part = GpuPartition(
            index=1, uuid="MIG-1", cdi_names=(f"{GPU}=mig-0-1",), attributes={"gpuInstanceId": 1}
        )
        return [card(0, BUS_A, self.uuids[0], part), card(1, BUS_B, self.uuids[1])]


@pytest.fixture
def vendor() -> SwappingVendor:
    return SwappingVendor()


@pytest.fixture
def plugins(vendor: SwappingVendor, monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv(LOAD_ENV, "")
    return load_plugins(extra=[("fakevendor", vendor)])


@pytest.fixture
def box(
    rdc_config: Path, make_fake_machine: Callable[[str], FakeMachine], plugins: Plugins
) -> Iterator[Machine]:
    """Set up (refreshed) with cards a and b, registered as `box`, the fake vendor the CLI's plugins."""
    fm = make_fake_machine("box")
    machine = build_machine(fm)
    fm.char_device("/dev/fakegpu0", 240, 0)  # the nodes the specs' gpu=0 and gpu=1 inject
    fm.char_device("/dev/fakegpu1", 240, 1)
    config = Config.load()
    config.add("box", machine.root)
    config.save()
    refresh(machine, plugins)
    set_plugins(plugins)
    try:
        yield machine
    finally:
        set_plugins(None)


@pytest.fixture
def store(box: Machine, plugins: Plugins) -> GrantStore:
    return GrantStore(box, plugins, running=Holdings(box))


@pytest.fixture
def alpha(box: Machine) -> Repo:
    return RepoStore(box).create("alpha")


@pytest.fixture
def beta(box: Machine) -> Repo:
    return RepoStore(box).create("beta")


def refresh(machine: Machine, plugins: Plugins, *, dry_run: bool = False) -> SetupReport:
    return run_setup(machine, plugins, {}, refresh=True, dry_run=dry_run)


def rdc(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def swapped(vendor: SwappingVendor, store: GrantStore, alpha: Repo, beta: Repo) -> None:
    """alpha holds card 0 (shared), beta card 1 exclusively; then the cards exchange slots."""
    store.grant(alpha, [GPU0])
    store.grant(beta, [GPU1], exclusive=True)
    vendor.uuids = ("GPU-b", "GPU-a")


def unsuspend_by_hand(machine: Machine) -> None:
    """The grants file as a hand edit or an older rdc leaves it: no grant marked suspended."""
    import dataclasses

    with state_lock(machine):
        write_grants(machine, [dataclasses.replace(g, suspended=None) for g in read_grants(machine)])


# --- every writer of the facts re-checks every grant --------------------------------------------------


def test_the_inventory_records_what_each_name_reaches(box: Machine) -> None:
    document = load_inventory(box)
    assert document is not None
    reaches = recorded_reaches(document)
    assert reaches[GPU0] == (UnitIdentity(f"pci:{BUS_A}", BUS_A, "GPU-a"),)
    assert reaches[GPU1] == (UnitIdentity(f"pci:{BUS_B}", BUS_B, "GPU-b"),)


def test_a_refresh_after_a_swap_suspends_the_moved_grants_and_its_dry_run_says_so(
    box: Machine, plugins: Plugins, vendor: SwappingVendor, store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    swapped(vendor, store, alpha, beta)
    before = box.grants_path.read_text()

    planned = refresh(box, plugins, dry_run=True)
    (step,) = [s for s in planned.plan if s.title == "Check the grants"]
    assert step.lines[1] == f"suspended: grant {GPU0} of alpha@box suspended: {SWAPPED}"
    assert step.lines[2].startswith(f"suspended: grant {GPU1} of beta@box suspended: it was granted on GPU-b")
    set_up = run_setup(box, plugins, {}, dry_run=True)  # setup's dry run says the same
    assert [s.lines for s in set_up.plan if s.title == "Check the grants"] == [step.lines]
    assert box.grants_path.read_text() == before  # a dry run changes nothing
    shown = rdc("machine", "refresh", "box", "--dry-run")
    assert shown.exit_code == 0 and f"suspended: grant {GPU0} of alpha@box suspended" in shown.stdout

    report = refresh(box, plugins)
    assert [(c.what, c.repo_ref) for c in report.grant_changes] == [
        (SUSPENDED, "alpha@box"),
        (SUSPENDED, "beta@box"),
    ]
    held = {g.device: g.suspended for g in read_grants(box)}
    first, second = held[GPU0], held[GPU1]
    assert first is not None and first.reason == MOVED and first.drift == SWAPPED
    assert second is not None and second.reason == MOVED
    assert LiveGrants(box).for_repo(alpha.id) == LiveGrants(box).for_repo(beta.id) == frozenset()


def test_the_cli_refresh_names_each_suspension_and_its_way_out(
    box: Machine, vendor: SwappingVendor, store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    swapped(vendor, store, alpha, beta)
    done = rdc("machine", "refresh", "box")
    assert done.exit_code == 0, done.output
    assert f"Warning: grant {GPU0} of alpha@box suspended: {SWAPPED}" in done.stderr
    assert f"rdc repo gpu confirm alpha@box --device {GPU0}" in done.stderr


# --- the gate and the guard compare a grant's recorded hardware with the inventory -------------------


def create(decider: Decider, device: str) -> Decision:
    body = {"Image": "busybox", "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": [device]}]}}
    return decider.decide("POST", "/v1.45/containers/create", "application/json", json.dumps(body).encode())


def live_decider(box: Machine, plugins: Plugins, repo: Repo) -> Decider:
    """A gate's decider on the machine's own files: the live grants, inventory and spec check."""
    return Decider(box, repo, plugins, lambda _image: None, lambda _line: None)


def test_the_gate_refuses_a_grant_whose_recorded_hardware_the_inventory_no_longer_places_it_on(
    box: Machine, plugins: Plugins, vendor: SwappingVendor, store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    swapped(vendor, store, alpha, beta)
    decider = live_decider(box, plugins, alpha)
    refresh(box, plugins)
    unsuspend_by_hand(box)  # whatever wrote it, the file says the grant is in force

    refused = create(decider, GPU0)
    assert not refused.forward and refused.rules == ("grant",)
    assert f"the grant of {GPU0} to repo alpha@box no longer reaches the hardware it was given on" in (
        refused.message
    )
    assert SWAPPED in refused.message
    assert f"rdc repo gpu confirm alpha@box --device {GPU0}" in refused.message
    assert f"rdc repo gpu revoke alpha@box --device {GPU0}" in refused.message
    # Confirmed on the card it reaches now (beta's reservation of that card revoked), it runs again.
    store.revoke(beta, [GPU1])
    confirm_grants(box, plugins, alpha, [GPU0])
    assert create(decider, GPU0).forward


def test_a_grant_without_a_record_or_an_inventory_without_one_keeps_todays_behaviour(
    box: Machine, plugins: Plugins, vendor: SwappingVendor, alpha: Repo
) -> None:
    with state_lock(box):
        write_grants(box, [Grant(alpha.id, GPU0, False, "2026-01-01T00:00:00Z")])  # an older file's
    vendor.uuids = ("GPU-b", "GPU-a")
    document = load_inventory(box)
    assert document is not None
    reaches = recorded_reaches(document)
    assert LiveGrants(box).for_repo(alpha.id, reaches) == {GPU0}
    bound = Grant(alpha.id, GPU0, False, "2026-01-01T00:00:00Z", bound_to=reaches[GPU1])
    with state_lock(box):
        write_grants(box, [bound])
    assert LiveGrants(box).for_repo(alpha.id, reaches) == frozenset()  # recorded on card b: refused
    assert LiveGrants(box).for_repo(alpha.id, {}) == {GPU0}  # an older inventory records nothing


def guard_args(box: Machine, repo: Repo, bundle: Path, *, inventory: bool = True) -> list[str]:
    """The guard's command line as the daemon's wrapper gives it (without `--inventory`: an older
    wrapper's, whose guard finds the inventory beside the grants file)."""
    (bundle / "config.json").write_text(
        json.dumps({"linux": {"devices": [{"path": "/dev/fakegpu0", "type": "c", "major": 240, "minor": 0}]}})
    )
    own = {
        "--runc": "/bin/false",
        "--grants": str(box.grants_path),
        "--cdi-dir": str(box.cdi_dir),
        "--repo-id": repo.id,
        "--repo-ref": repo.ref,
        "--guard-log": str(bundle / "guard.log"),
        **({"--inventory": str(box.inventory_path)} if inventory else {}),
    }
    return [*(part for pair in own.items() for part in pair), "--", "create", "--bundle", str(bundle), "cid"]


def test_the_guard_refuses_a_grant_whose_recorded_hardware_the_inventory_no_longer_places_it_on(
    box: Machine,
    plugins: Plugins,
    vendor: SwappingVendor,
    store: GrantStore,
    alpha: Repo,
    beta: Repo,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    swapped(vendor, store, alpha, beta)
    opts, runc_args = guard.parse_own_args(guard_args(box, alpha, tmp_path))
    guard.decide(opts, runc_args, str(tmp_path))  # granted, and on the card it recorded: runs

    refresh(box, plugins)
    unsuspend_by_hand(box)
    with pytest.raises(guard.Refused) as refused:
        guard.decide(opts, runc_args, str(tmp_path))
    assert refused.value.suspended and refused.value.names == (GPU0,)
    assert f"no longer reaches the hardware it was given on ({SWAPPED})" in str(refused.value)
    # As runc's caller sees it: the drift and the way out.
    assert guard.main(guard_args(box, alpha, tmp_path)) == 1
    said = capsys.readouterr().err
    assert f"rdc repo gpu confirm alpha@box --device {GPU0}" in said and "GPU-b" in said


def test_an_unreadable_inventory_refuses_a_grant_the_guard_must_compare(
    box: Machine, store: GrantStore, alpha: Repo, tmp_path: Path
) -> None:
    store.grant(alpha, [GPU0])
    opts, runc_args = guard.parse_own_args(guard_args(box, alpha, tmp_path, inventory=False))
    box.inventory_path.write_text("{not json")
    with pytest.raises(guard.Refused, match="inventory cannot be read"):
        guard.decide(opts, runc_args, str(tmp_path))
    box.inventory_path.unlink()  # never set up: nothing to compare with
    guard.decide(opts, runc_args, str(tmp_path))


identities = st.builds(
    UnitIdentity,
    unit=st.sampled_from(["pci:a", "pci:b", "pci:a/mig:1", "cdi:x"]),
    pci_bus_id=st.sampled_from([None, "a", "b"]),
    uuid=st.sampled_from([None, "", "GPU-a", "gpu-A", "MIG-1"]),
    parent_uuid=st.sampled_from([None, "GPU-a", "GPU-b"]),
    instance=st.sampled_from([(), (("gpuInstanceId", 1),), (("computeInstanceId", 0), ("gpuInstanceId", 2))]),
)


@given(st.lists(identities, max_size=3), st.lists(identities, max_size=3))
def test_the_guard_compares_recorded_hardware_as_the_core_does(
    was: list[UnitIdentity], now: list[UnitIdentity]
) -> None:
    def keys(binding: list[UnitIdentity]) -> list[tuple[Any, ...]]:
        return sorted(guard.unit_key(u.to_json()) for u in binding)

    assert (keys(was) == keys(now)) == (drift(tuple(was), tuple(now)) is None)


# --- confirm onto another repo's recorded (suspended) exclusive reservation --------------------------


def test_confirm_onto_a_suspended_exclusive_reservation_is_refused(
    box: Machine, plugins: Plugins, vendor: SwappingVendor, store: GrantStore, alpha: Repo, beta: Repo
) -> None:
    swapped(vendor, store, alpha, beta)
    refresh(box, plugins)  # both suspended; card b, beta's, is at bus a now: alpha's gpu=0

    with pytest.raises(RefusedError) as refused:
        confirm_grants(box, plugins, alpha, [GPU0])
    assert (
        f"repo beta@box holds {GPU1} exclusively (suspended, still reserving it), which reaches the "
        f"same hardware as {GPU0} (GPU-b at {BUS_B}, which its grant recorded)"
    ) in refused.value.what
    assert f"`rdc repo gpu revoke beta@box --device {GPU1}`" in (refused.value.todo or "")
    assert all(g.suspended is not None for g in read_grants(box))  # nothing was confirmed

    said = rdc("repo", "gpu", "confirm", "alpha@box", "--device", GPU0)
    assert said.exit_code == EXIT_REFUSED == 4
    assert f"repo beta@box holds {GPU1} exclusively" in said.stderr
    # A new grant of card b is refused the same way: the reservation follows the card.
    with pytest.raises(RefusedError, match=f"repo beta@box holds {GPU1} exclusively"):
        store.grant(RepoStore(box).create("gamma"), [GPU0])

    store.revoke(beta, [GPU1])
    (confirmed,) = confirm_grants(box, plugins, alpha, [GPU0])
    assert confirmed.grant.suspended is None and confirmed.grant.bound_to is not None
    assert confirmed.grant.bound_to[0].uuid == "GPU-b"


# --- the gate decides no device request on facts older than the specs ---------------------------------


def test_a_device_request_on_facts_older_than_the_specs_is_refused_until_a_refresh(
    box: Machine, plugins: Plugins, store: GrantStore, alpha: Repo
) -> None:
    store.grant(alpha, [GPU0])
    decider = live_decider(box, plugins, alpha)
    assert create(decider, GPU0).forward
    spec = box.cdi_dir / "vendor-example.yaml"
    spec.write_text(spec.read_text() + "\n")  # the vendor's refresh unit rewrote it

    refused = create(decider, GPU0)
    assert not refused.forward and refused.rules == ("stale-facts",)
    assert "rdc machine refresh box" in refused.message
    refresh(box, plugins)
    assert create(decider, GPU0).forward


class OneContainer:
    """The repo daemon as the gate's start check sees it: one container made with `GPU0`."""

    def lookup(self, ref: str) -> Container | None:
        return Container("c" * 64, "trainer", (GPU0,)) if ref in ("trainer", "c" * 64) else None

    def exec_container(self, exec_id: str) -> str | None:
        return None


def test_a_start_of_a_container_holding_a_name_on_facts_older_than_the_specs_is_refused_until_a_refresh(
    box: Machine, plugins: Plugins, store: GrantStore, alpha: Repo
) -> None:
    # The daemon injects the name from the spec as it is at the start: rewritten at boot after two cards
    # exchanged slots, `GPU0` may reach the other card, and the grant was checked on the old spec.
    store.grant(alpha, [GPU0])
    decider = Decider(box, alpha, plugins, lambda _image: None, lambda _line: None, containers=OneContainer())

    def start() -> Decision:
        return decider.decide("POST", "/v1.45/containers/trainer/start", None, b"")

    assert start().forward
    spec = box.cdi_dir / "vendor-example.yaml"
    spec.write_text(spec.read_text() + "\n")
    refused = start()
    assert not refused.forward and refused.rules == ("stale-facts",)
    assert "rdc machine refresh box" in refused.message
    refresh(box, plugins)
    assert start().forward
