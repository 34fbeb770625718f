"""A simulated machine with hand-written CDI specs and a fake vendor plugin, for the repo and grant tests.

The fake vendor maps CDI names to hardware units from the machine's inventory the way a real vendor
plugin does: a card is `pci:<bus id>`, a slice of it `pci:<bus id>/mig:<n>`, and `gpu=all` reaches
every card. A second kind, `other.example/render`, stands for another plugin's view of the same
cards (a render node owned by card a or b).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rediacc_core import Inventory, hookimpl
from rediacc_core.config import Config
from rediacc_core.machine import Machine
from rediacc_core.plugins import LOAD_ENV, Plugins, load_plugins, set_plugins
from rediacc_core.testing import FakeMachine

GPU = "vendor.example/gpu"
RENDER = "other.example/render"
BUS_A = "0000:0a:00.0"
BUS_B = "0000:0b:00.0"

# Every device the specs define. 2..7 and `nounits` appear in no inventory entry, so they reach no
# known hardware and only same-name exclusivity applies to them.
GPU_DEVICES = [*map(str, range(8)), "all", "GPU-aaaa", "mig-0-1", "mig-0-2", "nounits"]
RENDER_DEVICES = ["renderD128", "renderD129"]


def _spec(kind: str, names: list[str], root: Path) -> str:
    lines = ["cdiVersion: 0.5.0", f"kind: {kind}", "devices:"]
    for index, name in enumerate(names):
        lines += [
            f'  - name: "{name}"',
            "    containerEdits:",
            "      deviceNodes:",
            f"        - path: /dev/fake{kind.split('/')[1]}{index}",
            f"          hostPath: {root}/dev/fake{kind.split('/')[1]}{index}",
        ]
    return "\n".join(lines) + "\n"


def _inventory(machine: str) -> dict[str, Any]:
    def gpu(index: int, bus: str, names: list[str], partitions: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "vendor": "example",
            "source": "fakevendor",
            "name": f"Example GPU {index}",
            "index": index,
            "pciBusId": bus,
            "driver": "example",
            "driverVersion": "1.0",
            "memoryMiB": 1024,
            "cdiNames": names,
            "attributes": {},
            "partitions": partitions,
        }

    def part(index: int, name: str) -> dict[str, Any]:
        return {
            "index": index,
            "uuid": None,
            "profile": None,
            "memoryMiB": None,
            "cdiNames": [name],
            "attributes": {},
        }

    return {
        "schemaVersion": 1,
        "generatedAt": "2026-01-01T00:00:00Z",
        "machine": machine,
        "platform": "native",
        "gpus": [
            gpu(
                0,
                BUS_A,
                [f"{GPU}=0", f"{GPU}=GPU-aaaa", f"{GPU}=all", f"{RENDER}=renderD128"],
                [part(1, f"{GPU}=mig-0-1"), part(2, f"{GPU}=mig-0-2")],
            ),
            gpu(1, BUS_B, [f"{GPU}=1", f"{GPU}=all", f"{RENDER}=renderD129"], []),
        ],
        "devices": [],
    }


def build_machine(fm: FakeMachine) -> Machine:
    """Specs under <root>/etc/cdi and an inventory, as `rdc machine setup` would have left them."""
    root = fm.machine.root
    fm.write("/etc/cdi/vendor-example.yaml", _spec(GPU, GPU_DEVICES, root))
    fm.write("/etc/cdi/other-example.yaml", _spec(RENDER, RENDER_DEVICES, root))
    fm.write("/etc/rediacc/gpu/inventory.json", json.dumps(_inventory(fm.machine.name), indent=2))
    return fm.machine


def set_uuids(machine: Machine, first: str, second: str, *, mig: str | None = "MIG-1") -> None:
    """Give the inventory's two cards (bus a, bus b: indexes 0 and 1) these uuids, as a setup would
    record them; a swap exchanges them behind the same indexes and buses."""
    document = json.loads(machine.inventory_path.read_text())
    for gpu, uuid in zip(document["gpus"], (first, second), strict=True):
        gpu["attributes"] = {"uuid": uuid}
    document["gpus"][0]["partitions"][0]["uuid"] = mig
    document["gpus"][0]["partitions"][0]["attributes"] = {"gpuInstanceId": 1, "computeInstanceId": 0}
    machine.inventory_path.write_text(json.dumps(document))


class FakeVendor:
    """Hardware units from the machine's typed inventory."""

    def __init__(self) -> None:
        self.unit_calls: list[str] = []

    @hookimpl
    def rdc_hardware_units(self, name: str, inventory: Inventory) -> list[str] | None:
        if not name.startswith((f"{GPU}=", f"{RENDER}=")):
            return None
        self.unit_calls.append(name)
        holder = inventory.holder(name)
        if holder is None:
            return []
        gpu, part = holder
        return [f"pci:{gpu.pci_bus_id}" + (f"/mig:{part.index}" if part is not None else "")]


def fake_plugins() -> Plugins:
    """Only the fake vendor: no installed plugin takes part."""
    previous = os.environ.get(LOAD_ENV)
    os.environ[LOAD_ENV] = ""
    try:
        return load_plugins(extra=[("fakevendor", FakeVendor())])
    finally:
        if previous is None:
            del os.environ[LOAD_ENV]
        else:
            os.environ[LOAD_ENV] = previous


@contextmanager
def registered_box(fm: FakeMachine) -> Iterator[Machine]:
    """`build_machine(fm)` registered as machine `box` in the client's config, with the fake plugins
    the ones `rdc` commands load while it is in use (for suites that drive the CLI)."""
    machine = build_machine(fm)
    config = Config.load()
    config.add("box", machine.root)
    config.save()
    set_plugins(fake_plugins())
    try:
        yield machine
    finally:
        set_plugins(None)
