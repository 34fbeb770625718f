"""`--all` asks every machine at once: answers keep `rdc machine list`'s order, a machine whose
query breaks is a row of its own, and what every query needs from this host is read once."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pytest

from rediacc_core.cli import fleet
from rediacc_core.config import Config
from rediacc_core.remote import protocol


@dataclass(frozen=True)
class _Machine:
    name: str


class _Config:
    def __init__(self, names: list[str]) -> None:
        self.names = names

    def machines(self) -> list[_Machine]:
        return [_Machine(n) for n in self.names]


@pytest.fixture
def fleet_of(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(names: list[str], ask: Any) -> None:
        monkeypatch.setattr(Config, "load", staticmethod(lambda: _Config(names)))
        monkeypatch.setattr(fleet, "_idle_localhost", lambda _m: False)
        monkeypatch.setattr(fleet, "_ask", ask)

    return make


def test_answers_come_in_machine_order_whichever_finishes_first(fleet_of: Any) -> None:
    def ask(_config: object, machine: _Machine, argv: list[str]) -> fleet.Answer:
        time.sleep(0.05 if machine.name == "a" else 0)  # the first machine answers last
        return fleet.Answer(machine.name, data=argv)

    fleet_of(["a", "b", "c"], ask)
    answers = fleet.ask_all(lambda name: ["repo", "list", name])
    assert [a.machine for a in answers] == ["a", "b", "c"]
    assert answers[1].data == ["repo", "list", "b", "-o", "json"]


def test_a_machine_whose_query_breaks_is_its_own_failed_row(fleet_of: Any) -> None:
    def ask(_config: object, machine: _Machine, _argv: list[str]) -> fleet.Answer:
        if machine.name == "b":
            raise OSError("no route")
        return fleet.Answer(machine.name, data=[])

    fleet_of(["a", "b", "c"], ask)
    answers = fleet.ask_all(lambda name: ["repo", "list", name])
    assert [(a.machine, a.error) for a in answers] == [("a", None), ("b", "OSError: no route"), ("c", None)]
    assert fleet.exit_code(answers) != 0


def test_the_installed_versions_are_read_once_however_many_threads_ask_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = []
    real = metadata.version

    def counted(name: str) -> str:
        reads.append(name)
        time.sleep(0.05)  # long enough for every thread to arrive while the first one reads
        return real(name)

    protocol._installed.cache_clear()
    monkeypatch.setattr(metadata, "version", counted)
    try:
        threads = [threading.Thread(target=protocol.versions) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        protocol._installed.cache_clear()
    assert reads == [protocol.CORE_DISTRIBUTION]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the point
def test_a_machine_whose_thread_dies_is_still_a_failed_row(fleet_of: Any) -> None:
    def ask(_config: object, machine: _Machine, _argv: list[str]) -> fleet.Answer:
        if machine.name == "b":
            raise SystemExit(3)  # what `except Exception` lets through
        return fleet.Answer(machine.name, data=[])

    fleet_of(["a", "b"], ask)
    answers = fleet.ask_all(lambda name: ["repo", "list", name])
    assert [(a.machine, a.error) for a in answers] == [("a", None), ("b", "no answer")]
    assert fleet.exit_code(answers) != 0


def test_a_machine_that_did_not_answer_has_its_failure_in_a_column_of_its_own() -> None:
    grant = {"device": "vendor.example/gpu=0", "exclusive": True}
    answers = [
        fleet.Answer("a", data=[{"ref": "x@a", "id": "1", "grants": [grant]}]),
        fleet.Answer("b", error="cannot reach machine b", exit=14),
    ]
    headers, rows = fleet.repo_rows(answers)
    assert headers == ["MACHINE", "REPO", "ID", "GPU GRANTS", "FAILURE"]
    assert rows == [
        ["a", "x@a", "1", "vendor.example/gpu=0 *", None],
        ["b", None, None, None, "cannot reach machine b"],
    ]
    assert fleet.repo_rows(answers[:1])[0] == ["MACHINE", "REPO", "ID", "GPU GRANTS"]  # none failed
