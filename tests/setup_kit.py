"""A vendor plugin in miniature, so setup, the inventory and the CLI are tested without real vendors.

`FakeVendor` implements the same hooks a real vendor plugin does. Its GPUs, spec documents, steps
and generator commands are whatever a test hands it; `generator_script` is a stand-in tool that
writes a spec to the `--output` path the way a vendor's spec generator does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click

from rediacc_core import CdiSpecFile, Gpu, GpuPartition, SetupContext, SetupStep, hookimpl
from rediacc_core.machine import Machine
from rediacc_core.plugins import Plugins, load_plugins, set_plugins
from rediacc_core.testing import FakeMachine

KIND = "vendor.example/gpu"


def spec_document(fm: FakeMachine, names: Sequence[str]) -> dict[str, Any]:
    """A valid spec defining `vendor.example/gpu=<name>` for each name, one device node each."""
    devices = []
    for name in names:
        node = f"/dev/examplegpu{name}"
        fm.char_device(node, 195, int(name) if name.isdigit() else 255)
        devices.append(
            {
                "name": name,
                "containerEdits": {"deviceNodes": [{"path": node, "hostPath": str(fm.path(node))}]},
            }
        )
    return {"cdiVersion": "0.6.0", "kind": KIND, "devices": devices}


def example_gpu(index: int, *, partitions: Sequence[GpuPartition] = (), **attributes: Any) -> Gpu:
    return Gpu(
        vendor="example",
        source="fakevendor",
        name=f"Example GPU {index}",
        index=index,
        pci_bus_id=f"0000:0{index + 1}:00.0",
        driver="examplegpu",
        driver_version="550.54.14",
        memory_mib=81559,
        # `=all` is expected by the plugin but no spec in these tests defines it: the inventory drops it.
        cdi_names=(f"{KIND}={index}", f"{KIND}=all"),
        attributes={"uuid": f"GPU-{index:08d}", **attributes},
        partitions=tuple(partitions),
    )


class FakeVendor:
    """Hook implementations driven by plain attributes a test sets."""

    def __init__(
        self,
        gpus: Sequence[Gpu] = (),
        specs: Sequence[CdiSpecFile] = (),
        steps: Sequence[SetupStep] = (),
    ) -> None:
        self.gpus = list(gpus)
        self.specs = list(specs)
        self.steps = list(steps)
        self.contexts: list[SetupContext] = []

    @hookimpl
    def rdc_discover(self, machine: Machine) -> list[Gpu]:
        return list(self.gpus)

    @hookimpl
    def rdc_setup_options(self) -> list[click.Option]:
        return [
            click.Option(
                ["--example-toolkit"],
                type=click.Choice(["auto", "true", "false"]),
                default="auto",
                help="Install the example toolkit.",
            )
        ]

    @hookimpl
    def rdc_setup_steps(self, ctx: SetupContext) -> list[SetupStep]:
        self.contexts.append(ctx)
        return list(self.steps)

    @hookimpl
    def rdc_cdi_specs(self, ctx: SetupContext) -> list[CdiSpecFile]:
        return list(self.specs)


def use_vendor(vendor: object, name: str = "fakevendor") -> Plugins:
    """Make `vendor` the only plugin the CLI sees (REDIACC_LOAD_PLUGINS must be "")."""
    plugins = load_plugins(extra=[(name, vendor)])
    set_plugins(plugins)
    return plugins


GENERATED = {
    "ok": "cdiVersion: 0.6.0\nkind: vendor.example/gpu\ndevices:\n"
    "- name: all\n  containerEdits:\n    env: [EXAMPLE_VISIBLE=all]\n",
    "invalid": "cdiVersion: 0.6.0\nkind: not a kind\ndevices:\n"
    '- name: "0"\n  containerEdits:\n    env: [A=1]\n',
    "garbage": "cdiVersion: [unclosed\n",
}


def generator_script(mode: str = "ok") -> str:
    """A stand-in spec generator: `examplegen ... --output=PATH`.

    mode `ok` writes a valid spec, `fail` prints its own error and exits 3 without writing,
    `silent` exits 0 without writing, `invalid` writes a spec with a malformed kind, `garbage`
    writes text that is not YAML.
    """
    head = '#!/bin/sh\nfor arg in "$@"; do case "$arg" in --output=*) out="${arg#--output=}";; esac; done\n'
    if mode == "silent":
        return head + "exit 0\n"
    if mode == "fail":
        return head + 'echo "examplegen: driver/library version mismatch (550.54 vs 535.1)" >&2\nexit 3\n'
    return head + f"cat > \"$out\" <<'SPEC'\n{GENERATED[mode]}SPEC\n"


def demo_layout(fm: FakeMachine) -> None:
    """A `rediacc.demo` entry point target: marks the fake machine so a test can see it ran."""
    fm.write("/etc/example-demo-layout", "laid out\n")
