"""The gate's advice is computed from what it would do: a typo of a name the repo holds already is
answered with that name (no grant to ask for), and a start whose lease has ended says so, with when
and the grant that brings it back (a renew of it too)."""

from __future__ import annotations

from typing import Any

from rediacc_core.gate.decide.containers import Container
from rediacc_core.grants.records import Grant, write_grants

Gate = Any  # tests/gate/conftest.py's Gate
GPU0 = "vendor.example/gpu=0"


def test_a_typo_of_a_name_the_repo_holds_is_answered_with_that_name(gate: Gate) -> None:
    gate.grant(GPU0)
    body = {
        "Image": "bb",
        "HostConfig": {"DeviceRequests": [{"Driver": "cdi", "DeviceIDs": ["vendor.example/gpu=O"]}]},
    }
    decision = gate.create(body)
    assert not decision.forward
    assert "did you mean vendor.example/gpu=0 or vendor.example/gpu=1?" in decision.message
    assert f"(repo alpha holds {GPU0} already: --device {GPU0})" in decision.message
    assert "rdc repo gpu grant" not in decision.message


class Held:
    def lookup(self, ref: str) -> Container | None:
        return Container("c" * 64, ref, (GPU0,), state="exited")

    def exec_container(self, exec_id: str) -> str | None:
        return None


def test_a_start_whose_lease_ended_names_the_end(gate: Gate) -> None:
    repo = gate.decider.repo
    ended = Grant(repo.id, GPU0, False, "2026-01-01T00:00:00Z", expires_at="2026-01-02T00:00:00Z")
    gate.fm.machine.grants_path.parent.mkdir(parents=True, exist_ok=True)
    write_grants(gate.fm.machine, [ended])
    gate.rebuild(containers=Held())
    for verb in ("start", "restart"):
        decision = gate.post(f"/v1.45/containers/trainer/{verb}")
        assert not decision.forward and decision.rules == ("grant",)
        assert (
            f"container trainer holds {GPU0}, whose lease to repo alpha ended at 2026-01-02T00:00:00Z"
            in decision.message
        )
        assert f"rdc repo gpu grant alpha@m1 --device {GPU0} --for 8h" in decision.message


def test_renewing_an_ended_lease_says_when_it_ended_and_grants_it_anew(gate: Gate) -> None:
    from rediacc_core.errors import NotFoundError
    from rediacc_core.grants.store import GrantStore

    repo = gate.decider.repo
    ended = Grant(repo.id, GPU0, False, "2026-01-01T00:00:00Z", expires_at="2026-01-02T00:00:00Z")
    gate.fm.machine.grants_path.parent.mkdir(parents=True, exist_ok=True)
    write_grants(gate.fm.machine, [ended])
    try:
        GrantStore(gate.fm.machine, gate.decider.plugins).renew(repo, [GPU0], None)
    except NotFoundError as exc:
        assert f"the lease of {GPU0} to alpha@m1 ended at 2026-01-02T00:00:00Z" in exc.what
        assert exc.todo == f"grant it anew: rdc repo gpu grant alpha@m1 --device {GPU0} --for 8h"
    else:
        raise AssertionError("an ended lease was renewed")
