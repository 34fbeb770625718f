"""A gate decider on a simulated machine, with grants held in memory and a plugin that tests can program."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

# The proxy's fixtures (a gate in this process before a real HTTP server), for every file here.
from proxy_kit import env, env_down, new_loop, short_dir  # noqa: F401

from rediacc_core import ApiRequest, GateContext, Refusal, Rewrite, Verdict, hookimpl
from rediacc_core.gate.decide.decider import Decider, Decision
from rediacc_core.gate.policy.pins import release_all
from rediacc_core.plugins import load_plugins
from rediacc_core.repos import Repo
from rediacc_core.testing.fakemachine import FakeMachine

REPO = Repo(
    id="6f1d0d6e-3a57-4d5c-9d59-0a4f2f2b8c11",
    name="alpha",
    tag=None,
    machine="m1",
    docker_host=None,
    created_at="2026-01-01T00:00:00Z",
)


@dataclass
class ProgrammablePlugin:
    """Answers `rdc_request_rules` with whatever `answer` returns, and records what it saw."""

    answer: Callable[[ApiRequest, GateContext], list[Verdict]] = lambda request, ctx: []
    seen: list[tuple[ApiRequest, GateContext]] = field(default_factory=list)

    @hookimpl
    def rdc_request_rules(self, request: ApiRequest, ctx: GateContext) -> list[Verdict]:
        self.seen.append((request, ctx))
        return self.answer(request, ctx)


@dataclass
class Gate:
    decider: Decider
    plugin: ProgrammablePlugin
    grants: dict[str, set[str]]
    fm: FakeMachine
    logs: list[str]
    build: Callable[..., Decider]

    def rebuild(self, **parts: Any) -> None:
        """A new decider over the same machine, plugins, grants and log, handed `parts` by the
        Decider's keywords (a fake `containers` lookup, an `image_config`, a `grants` reader)."""
        self.decider = self.build(**parts)

    def post(
        self,
        target: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        content_type: str | None = "application/json",
        method: str = "POST",
    ) -> Decision:
        data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        return self.decider.decide(method, target, content_type, data)

    def create(self, body: dict[str, Any], **kwargs: Any) -> Decision:
        return self.post("/v1.45/containers/create", body, **kwargs)

    def grant(self, *names: str) -> None:
        self.grants.setdefault(REPO.id, set()).update(names)


@pytest.fixture
def gate(fake_machine: FakeMachine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    monkeypatch.setenv("REDIACC_LOAD_PLUGINS", "")
    plugin = ProgrammablePlugin()
    plugins = load_plugins(extra=[("programmable", plugin)])
    grants: dict[str, set[str]] = {}
    logs: list[str] = []
    fm = fake_machine
    fm.char_device("/dev/null", 1, 3)
    fm.char_device("/dev/vendor/card0", 226, 0)
    fm.mkdir("/mnt/data")
    fm.symlink("/mnt/devlink", "/dev")
    fm.symlink("/mnt/cardlink", "/dev/vendor/card0")
    fm.symlink("/mnt/rootlink", "/")
    fm.symlink("/mnt/loop", "/mnt/loop")
    # The devices the tests ask for exist on the machine: a refusal of one is about its grant.
    for file, kind, names in (
        ("vendor", "vendor.example/gpu", ("0", "1")),
        ("dri", "rediacc.io/dri", ("renderD128",)),
    ):
        devices = [
            {"name": n, "containerEdits": {"deviceNodes": [{"path": "/dev/vendor/card0"}]}} for n in names
        ]
        fm.write(
            f"/etc/cdi/{file}.yaml",  # JSON is YAML too; a test may replace the file with its own
            json.dumps({"cdiVersion": "0.5.0", "kind": kind, "devices": devices}),
        )

    def build(**parts: Any) -> Decider:
        given: dict[str, Any] = {
            "image_config": lambda image: None,
            "grants": lambda repo_id: frozenset(grants.get(repo_id, set())),
            **parts,
        }
        return Decider(fm.machine, REPO, plugins, log=logs.append, **given)

    made = Gate(build(), plugin, grants, fm, logs, build)
    yield made
    release_all(made.decider.pins.directory)  # admitted binds were pinned with real mounts


def refuse_with(*verdicts: Verdict) -> Callable[[ApiRequest, GateContext], list[Verdict]]:
    return lambda request, ctx: list(verdicts)


__all__ = ["REPO", "Gate", "ProgrammablePlugin", "Refusal", "Rewrite", "refuse_with"]
