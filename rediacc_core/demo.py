"""A simulated machine for `rdc demo`: the main job end to end, with no GPU needed.

The core knows no hardware, so the GPUs come from plugins: each may register a callable under the
entry-point group `rediacc.demo` that lays its hardware out on the fake machine
(`callable(fake_machine: FakeMachine) -> None`). With none registered the demo machine simply has
no GPUs, which setup handles like any other machine.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from rediacc_core.errors import RdcError, StateError
from rediacc_core.gate.decide.decider import Decider
from rediacc_core.grants.records import delete_repo
from rediacc_core.grants.store import GrantStore
from rediacc_core.inventory import load_inventory
from rediacc_core.machine import Machine
from rediacc_core.plugins import Plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.testing.fakemachine import FakeMachine

ENTRY_POINT_GROUP = "rediacc.demo"
DEMO_MACHINE = "demo"
# Marks a root as the demo's own, so rebuilding it can never wipe a directory someone else made.
MARKER = ".rdc-demo"


@dataclass
class DemoMachine:
    fake: FakeMachine
    layouts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def is_demo_root(root: Path) -> bool:
    return (root / MARKER).exists()


def build_demo_machine(workdir: Path, name: str = DEMO_MACHINE) -> DemoMachine:
    """A fresh fake machine under `workdir/root`, its stand-in tools in its own `/usr/bin`."""
    root = workdir / "root"
    ours = is_demo_root(root)  # asked once: wiping the root removes the marker
    for directory in (root, workdir / "bin"):  # bin: where stand-ins were before they moved in
        if directory.exists() and any(directory.iterdir()):
            if not ours:
                raise StateError(
                    f"{directory} exists and was not made by `rdc demo`",
                    "choose an empty or new --workdir",
                )
            shutil.rmtree(directory)
    fake = FakeMachine(root.absolute(), name=name)
    (root / MARKER).write_text("made by `rdc demo`; safe to delete\n", encoding="utf-8")
    demo = DemoMachine(fake)
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            ep.load()(fake)
        except Exception as exc:  # one plugin's broken layout must not spoil the others'
            demo.problems.append(f"layout {ep.name!r} failed: {type(exc).__name__}: {exc}")
            continue
        demo.layouts.append(ep.name)
    return demo


# --- the walkthrough: grants and gate decisions on the demo machine ----------------------------


@dataclass(frozen=True)
class Step:
    """One thing the walkthrough did, the command a person would have typed, and what came of it."""

    command: str
    outcome: str
    ok: bool


def _device_pick(inventory: Mapping[str, Any]) -> tuple[str, str, str | None] | None:
    """A card's name, another name for the same card, and a name of a different card (if any).

    Chosen from whatever the plugins found, so the walkthrough needs no vendor knowledge.
    """
    cards = [
        [n for n in gpu.get("cdiNames", []) if not n.endswith("=all")] for gpu in inventory.get("gpus", [])
    ]
    cards = [names for names in cards if names]
    if not cards:
        return None
    other = next(
        (names[0] for names in cards[1:] if names[0].split("=")[0] == cards[0][0].split("=")[0]), None
    )
    return cards[0][0], cards[0][-1], other


def _create_body(devices: list[str], *, gpus_flag: bool = False) -> bytes:
    """What `docker run` sends for `--device NAME…` (or `--gpus all`) with the demo image."""
    host: dict[str, Any] = {"NetworkMode": "none"}
    if gpus_flag:
        host["DeviceRequests"] = [{"Driver": "", "Count": -1, "Capabilities": [["gpu"]]}]
    elif devices:
        host["DeviceRequests"] = [{"Driver": "cdi", "DeviceIDs": devices}]
    return json.dumps({"Image": "busybox", "Cmd": ["ls", "/dev"], "HostConfig": host}).encode()


def walkthrough(machine: Machine, plugins: Plugins) -> list[Step]:
    """Repos, grants and gate decisions on a set-up demo machine, each as a person would do them.

    No Docker is needed: the gate's decision engine is asked directly with the bodies `docker run`
    sends. The names come from the machine's own inventory, so this works for any plugin set.
    """
    inventory = load_inventory(machine) or {}
    pick = _device_pick(inventory)
    if pick is None:
        return [Step("rdc machine gpu list demo", "no grantable GPU on this machine: nothing to grant", True)]
    device, sibling, other = pick
    repos, grants = RepoStore(machine), GrantStore(machine, plugins, running=Holdings(machine))
    for repo in repos.list():
        delete_repo(machine, repo)
    alpha, beta = repos.create("alpha"), repos.create("beta")
    steps: list[Step] = []

    def attempt(command: str, action: Callable[[], object], success: str) -> None:
        try:
            action()
        except RdcError as exc:
            steps.append(Step(command, f"refused (exit {exc.exit_code}): {exc.what}", False))
        else:
            steps.append(Step(command, success, True))

    def grant(repo: Repo, name: str, exclusive: bool = False) -> None:
        flag = " --exclusive" if exclusive else ""
        attempt(
            f"rdc repo gpu grant {repo.name}@demo --device {name}{flag}",
            lambda: grants.grant(repo, [name], exclusive=exclusive),
            "granted" + (f", reserved for {repo.name}" if exclusive else ""),
        )

    grant(alpha, device, exclusive=True)
    grant(beta, sibling)  # another name for alpha's reserved card
    kind, _, name = device.partition("=")
    grant(beta, f"{kind[:-1]}={name}")  # a typo: refused, with the nearest names
    if other is not None:
        grant(beta, other)

    def ask(repo: Repo, command: str, body: bytes) -> None:
        decider = Decider(machine, repo, plugins, lambda _image: None, lambda _line: None)
        decision = decider.decide("POST", "/v1.45/containers/create", "application/json", body)
        if decision.forward:
            steps.append(Step(f"[{repo.name}] {command}", "admitted: forwarded to the repo's dockerd", True))
        else:
            steps.append(
                Step(f"[{repo.name}] {command}", f"refused ({decision.status}): {decision.message}", False)
            )

    ask(alpha, f"docker run --device {device} busybox ls /dev", _create_body([device]))
    ask(beta, f"docker run --device {device} busybox ls /dev", _create_body([device]))
    ask(alpha, "docker run --gpus all busybox ls /dev", _create_body([], gpus_flag=True))
    return steps
