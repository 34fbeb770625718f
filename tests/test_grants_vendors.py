"""Exclusive grants across the real vendor plugins: a render node is part of the AMD card that owns it.

Runs only where the plugins are installed (the `dri` and `amd` tox envs, or the dev install).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from rediacc_core.errors import RefusedError
from rediacc_core.grants.store import GrantStore
from rediacc_core.machine import Machine
from rediacc_core.plugins import LOAD_ENV, Plugins, load_plugins
from rediacc_core.repos import Repo, RepoStore
from rediacc_core.runtime.holdings import Holdings
from rediacc_core.testing import FakeMachine

AMD = "rediacc.io/amd"
DRI = "rediacc.io/dri"
CARDS = {0: ("0000:03:00.0", 128), 1: ("0000:04:00.0", 129)}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv(LOAD_ENV, "amd,dri")
    loaded = load_plugins()
    for name in ("amd", "dri"):
        info = next((i for i in loaded.infos if i.name == name and i.error is None), None)
        if info is None or "rdc_hardware_units" not in info.hooks:
            pytest.skip(f"the {name} plugin (with rdc_hardware_units) is not installed")
    return loaded


def _spec(kind: str, names: list[str], root: str) -> str:
    lines = ["cdiVersion: 0.5.0", f"kind: {kind}", "devices:"]
    for i, name in enumerate(names):
        lines += [
            f'  - name: "{name}"',
            "    containerEdits:",
            "      deviceNodes:",
            f"        - path: /dev/x{kind.split('/')[1]}{i}",
            f"          hostPath: {root}/dev/x{kind.split('/')[1]}{i}",
        ]
    return "\n".join(lines) + "\n"


def _gpu(source: str, index: int | None, bus: str, minor: int, names: list[str]) -> dict[str, Any]:
    return {
        "vendor": "amd",
        "source": source,
        "name": f"card {bus}",
        "index": index,
        "pciBusId": bus,
        "driver": "amdgpu",
        "driverVersion": None,
        "memoryMiB": None,
        "cdiNames": names,
        "attributes": {"renderMinor": minor},
        "partitions": [],
    }


@pytest.fixture
def machine(make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    fm = make_fake_machine("rig")
    root = str(fm.machine.root)
    fm.write("/etc/cdi/amd.yaml", _spec(AMD, ["gpu0", "gpu1", "all"], root))
    fm.write("/etc/cdi/dri.yaml", _spec(DRI, ["renderD128", "renderD129"], root))
    gpus = []
    for index, (bus, minor) in CARDS.items():
        gpus.append(_gpu("amd", index, bus, minor, [f"{AMD}=gpu{index}", f"{AMD}=all"]))
        gpus.append(_gpu("dri", None, bus, minor, [f"{DRI}=renderD{minor}"]))
    inventory = {
        "schemaVersion": 1,
        "generatedAt": "2026-01-01T00:00:00Z",
        "machine": "rig",
        "platform": "native",
        "gpus": gpus,
        "devices": [],
    }
    fm.write("/etc/rediacc/gpu/inventory.json", json.dumps(inventory))
    return fm.machine


@pytest.fixture
def repos(machine: Machine) -> tuple[Repo, Repo]:
    return RepoStore(machine).create("alpha"), RepoStore(machine).create("beta")


@pytest.mark.parametrize(
    ("held", "blocked", "free"),
    [
        (f"{AMD}=gpu0", f"{DRI}=renderD128", f"{DRI}=renderD129"),
        (f"{DRI}=renderD129", f"{AMD}=gpu1", f"{AMD}=gpu0"),
        (f"{AMD}=all", f"{DRI}=renderD129", None),
    ],
)
def test_a_render_node_and_the_card_owning_it_are_the_same_hardware(
    machine: Machine, plugins: Plugins, repos: tuple[Repo, Repo], held: str, blocked: str, free: str | None
) -> None:
    alpha, beta = repos
    store = GrantStore(machine, plugins, running=Holdings(machine))
    store.grant(beta, [held], exclusive=True)
    with pytest.raises(RefusedError, match=f"repo beta@rig holds {held} exclusively"):
        store.grant(alpha, [blocked])
    if free is not None:
        store.grant(alpha, [free], exclusive=True)


# --- NVIDIA: all vs index, uuid vs index, MIG vs its GPU ------------------------------------------------

NV = "nvidia.com/gpu"
UUID0 = "GPU-11111111-2222-3333-4444-555555555555"
MIG01 = "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG02 = "MIG-ffffffff-bbbb-cccc-dddd-eeeeeeeeeeee"


@pytest.fixture
def nv_plugins(monkeypatch: pytest.MonkeyPatch) -> Plugins:
    monkeypatch.setenv(LOAD_ENV, "nvidia")
    loaded = load_plugins()
    info = next((i for i in loaded.infos if i.name == "nvidia" and i.error is None), None)
    if info is None or "rdc_hardware_units" not in info.hooks:
        pytest.skip("the nvidia plugin (with rdc_hardware_units) is not installed")
    return loaded


@pytest.fixture
def nv_machine(make_fake_machine: Callable[[str], FakeMachine]) -> Machine:
    fm = make_fake_machine("nv")
    names = ["0", "1", "all", UUID0, "0:1", "0:2", MIG01, MIG02]
    fm.write("/etc/cdi/nvidia.yaml", _spec(NV, names, str(fm.machine.root)))

    def part(index: int, uuid: str) -> dict[str, Any]:
        cdi = [f"{NV}=0:{index}", f"{NV}={uuid}"]
        return {
            "index": index,
            "uuid": uuid,
            "profile": "1g.10gb",
            "memoryMiB": 9728,
            "cdiNames": cdi,
            "attributes": {},
        }

    gpu0 = {
        **_gpu("nvidia", 0, "0000:01:00.0", 0, [f"{NV}=0", f"{NV}={UUID0}", f"{NV}=all"]),
        "vendor": "nvidia",
        "attributes": {"uuid": UUID0, "minor": 0, "migMode": "Enabled"},
        "partitions": [part(1, MIG01), part(2, MIG02)],
    }
    gpu1 = {
        **_gpu("nvidia", 1, "0000:02:00.0", 1, [f"{NV}=1", f"{NV}=all"]),
        "vendor": "nvidia",
        "attributes": {"uuid": "GPU-99999999-2222-3333-4444-555555555555", "minor": 1},
    }
    inventory = {
        "schemaVersion": 1,
        "generatedAt": "2026-01-01T00:00:00Z",
        "machine": "nv",
        "platform": "native",
        "gpus": [gpu0, gpu1],
        "devices": [],
    }
    fm.write("/etc/rediacc/gpu/inventory.json", json.dumps(inventory))
    return fm.machine


@pytest.mark.parametrize(
    ("held", "wanted", "overlap"),
    [
        (f"{NV}=all", f"{NV}=1", True),
        (f"{NV}={UUID0}", f"{NV}=0", True),
        (f"{NV}=0:1", f"{NV}=0", True),
        (f"{NV}={MIG02}", f"{NV}=0:2", True),
        (f"{NV}=0:1", f"{NV}=0:2", False),
        (f"{NV}=0", f"{NV}=1", False),
    ],
)
def test_nvidia_names_overlap_by_hardware(
    nv_machine: Machine, nv_plugins: Plugins, held: str, wanted: str, overlap: bool
) -> None:
    alpha, beta = RepoStore(nv_machine).create("alpha"), RepoStore(nv_machine).create("beta")
    store = GrantStore(nv_machine, nv_plugins, running=Holdings(nv_machine))
    store.grant(beta, [held], exclusive=True)
    if overlap:
        with pytest.raises(RefusedError, match="reaches the same hardware"):
            store.grant(alpha, [wanted])
    else:
        store.grant(alpha, [wanted], exclusive=True)
