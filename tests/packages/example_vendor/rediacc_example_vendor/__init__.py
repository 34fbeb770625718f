"""A third-party plugin for a made-up ACME accelerator, shaped as an outside vendor would ship one.

It is the worked example of every hook: `docs/hooks.md` quotes its functions, and the test suite
installs this package into a private directory and drives it through the real plugin manager and
the `rdc` command line (`tests/test_example_plugin.py`).

The hardware it knows: each card is `/sys/class/acme/acme<N>` (a `name` file, the kernel's `dev`
record, `device` linking to the PCI function) with its node `/dev/acme<N>`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import click

from rediacc_core import (
    ApiRequest,
    CdiSpecFile,
    GateContext,
    Gpu,
    HealthEvent,
    Inventory,
    Machine,
    Refusal,
    SetupContext,
    SetupStep,
    Verdict,
    atomic_write_text,
    device_node_edit,
    hookimpl,
    host_node,
    kernel_log,
    landing_paths,
    sysfs_dev_numbers,
)

KIND = "acme.com/gpu"
SOURCE = "example"  # the entry point's name, as `rdc plugins` lists it
RAW_NODE = re.compile(r"^/dev/acme(\d+)$")
FAULT = re.compile(r"acme (?P<bus>[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]): card fault (?P<code>\d+)")


@hookimpl
def rdc_discover(machine: Machine) -> list[Gpu]:
    gpus = []
    for card in sorted(machine.path("/sys/class/acme").glob("acme*")):
        index = int(card.name.removeprefix("acme"))
        gpus.append(
            Gpu(
                vendor="acme",
                source=SOURCE,
                name=(card / "name").read_text().strip(),
                index=index,
                pci_bus_id=(card / "device").resolve().name,
                cdi_names=(f"{KIND}={index}", f"{KIND}=all"),
            )
        )
    return gpus


@hookimpl
def rdc_setup_options() -> list[click.Option]:
    return [
        click.Option(
            ["--acme-device-mode"],
            type=click.Choice(["0660", "0666"]),
            default="0660",
            show_default=True,
            help="Permissions of /dev/acme* on the machine (a udev rule).",
        )
    ]


@hookimpl
def rdc_setup_steps(ctx: SetupContext) -> list[SetupStep]:
    if not any(gpu.source == SOURCE for gpu in ctx.gpus):
        return []
    rule_file = ctx.machine.path("/etc/udev/rules.d/70-acme.rules")
    rule = f'KERNEL=="acme[0-9]*", MODE="{ctx.options.get("acme_device_mode", "0660")}"\n'
    return [
        SetupStep(
            title="Set the permissions of /dev/acme*",
            plan=(f"write {rule_file}",),
            apply=lambda: atomic_write_text(rule_file, rule),
        )
    ]


@hookimpl
def rdc_cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    devices, every_node = [], []
    for gpu in ctx.gpus:
        if gpu.source != SOURCE:
            continue
        recorded = sysfs_dev_numbers(ctx.machine.path(f"/sys/class/acme/acme{gpu.index}/dev"))
        node = host_node(ctx.machine.path(f"/dev/acme{gpu.index}"), recorded)
        if node is not None:
            edit = device_node_edit(f"/dev/acme{gpu.index}", node)
            devices.append({"name": str(gpu.index), "containerEdits": {"deviceNodes": [edit]}})
            every_node.append(edit)
    if not devices:
        return [CdiSpecFile(filename="acme.yaml")]  # ours, but nothing to describe now: removed
    devices.append({"name": "all", "containerEdits": {"deviceNodes": every_node}})
    spec = {"cdiVersion": "0.5.0", "kind": KIND, "devices": devices}
    return [CdiSpecFile(filename="acme.yaml", spec=spec)]


@hookimpl
def rdc_hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    if not name.startswith(f"{KIND}="):
        return None  # another vendor's name
    if name == f"{KIND}=all":
        cards = [f"pci:{gpu.pci_bus_id}" for gpu in inventory.from_source(SOURCE) if gpu.pci_bus_id]
        return cards or [f"cdi:{name}"]
    holder = inventory.holder(name)  # the GPU (and partition) the inventory lists the name under
    if holder is None or holder[0].pci_bus_id is None:
        return [f"cdi:{name}"]  # unknown hardware: the name reserves only itself
    return [f"pci:{holder[0].pci_bus_id}"]


@hookimpl
def rdc_request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    verdicts: list[Verdict] = []
    for raw in request.raw_device_paths():
        found = [match for path in landing_paths(ctx.machine, raw) if (match := RAW_NODE.match(path))]
        if not found:
            continue
        name = f"{KIND}={found[-1].group(1)}"
        message = f"raw device {raw} is refused: ACME cards reach containers as CDI devices"
        if ctx.inventory is not None and ctx.inventory.holder(name) is None:
            message += f" ({name} is not in the machine's inventory: run `rdc machine setup`)"
        elif name not in ctx.grants:
            message += f"; grant it first: rdc repo gpu grant {ctx.repo_ref} --device {name}"
        # `subject` is the value refused, as the core's rule names it: theirs about `raw` gives way.
        refusal = Refusal(message=message, replacement=f"--device {name}", rule="raw-device", subject=raw)
        verdicts.append(refusal)
    return verdicts


@hookimpl
def rdc_health(machine: Machine, inventory: Inventory) -> list[HealthEvent]:
    ours = {gpu.pci_bus_id for gpu in inventory.from_source(SOURCE)}
    events = []
    for line in kernel_log(machine):  # `[  812.250731] acme 0000:41:00.0: card fault 7`
        found = FAULT.search(line)
        if found and found.group("bus") in ours:
            message = line[found.start() :]
            events.append(
                HealthEvent(
                    pci_bus_id=found.group("bus"),
                    reason=f"fault-{found.group('code')}",
                    message=message,
                    key=line,
                )
            )
    return events


@hookimpl
def rdc_housekeeping(
    machine: Machine, repo_id: str, log: Callable[[str], None]
) -> list[Callable[[], object]]:
    beat = machine.path("/run/acme/gates") / repo_id  # the vendor's watchdog reads each gate's beat

    def heartbeat() -> None:
        beat.parent.mkdir(parents=True, exist_ok=True)
        first = not beat.exists()
        beat.write_text(f"{time.time():.0f}\n")
        if first:
            log(f"acme: watchdog told of repo {repo_id}")

    return [heartbeat]
