"""The contract between the core and vendor plugins.

Every hook is prefixed `rdc_`. A plugin implements any subset with `@rediacc_core.hookimpl`.
Each hook has a worked example in `docs/hooks.md`, quoted from the example plugin the tests install
(`tests/packages/example_vendor`); `tests/test_hook_docs.py` fails when a hook lacks a doc section
whose signature matches this file, or a test that implements or calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable

    import click

    from rediacc_core.machine import Machine
    from rediacc_core.model import (
        ApiRequest,
        CdiSpecFile,
        GateContext,
        Gpu,
        HealthEvent,
        Inventory,
        SetupContext,
        SetupStep,
        Verdict,
    )

PROJECT = "rediacc"

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def rdc_discover(machine: Machine) -> list[Gpu]:
    """Find the GPUs this plugin knows how to see on `machine`.

    Read everything through `machine.path(...)` and run tools through `machine.run(...)` so
    simulated machines work. Return `[]` when there is nothing: a machine without GPUs is normal.
    Raise `rediacc_core.errors.ToolError` only when a tool that should work failed.
    """
    raise NotImplementedError


@hookspec
def rdc_setup_options() -> list[click.Option]:
    """Options this plugin adds to `rdc machine setup`.

    The parsed values reach `SetupContext.options` under each option's parameter name.
    """
    raise NotImplementedError


@hookspec
def rdc_setup_steps(ctx: SetupContext) -> list[SetupStep]:
    """Steps to prepare the machine before specs are written (install a toolkit, write a unit).

    Each step says what it will do in `plan`, so `rdc machine setup --dry-run` prints the plan
    and changes nothing.
    """
    raise NotImplementedError


@hookspec
def rdc_cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    """The CDI spec files this plugin owns, produced from the discovered GPUs.

    The core validates every produced spec before writing any of them, writes them atomically to
    `<root>/etc/cdi`, and removes an owned file returned without content. A spec's `deviceNodes`
    keep `path` as the container sees it and set `hostPath` under the machine root.
    """
    raise NotImplementedError


@hookspec(firstresult=True)
def rdc_hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    """The hardware a qualified CDI `name` reaches, so exclusive grants can follow hardware.

    `inventory` is the machine's, typed (empty when setup never ran): look the name up with
    `inventory.holder(name)`, or your GPUs with `inventory.from_source(...)`.

    A unit is a `/`-separated path that starts at the card's PCI bus id, lower case with domain
    (`pci:0000:01:00.0`); a slice of a card adds segments (`pci:0000:01:00.0/mig:1`). Two names
    overlap when a unit of one equals, or is an ancestor of, a unit of the other. Return None for
    names this plugin does not own; the first non-None answer wins.
    """
    raise NotImplementedError


@hookspec
def rdc_request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    """Refusals or rewrites for one Docker API request reaching a repo's gate.

    Called for every request whose body the gate decodes, the routes `container-create`,
    `container-update`, `exec-create`, `volume-create`, `network-create`, `network-connect` and
    `auth` (the names of `gate/policy/endpoints.py`; routes the gate refuses whole, such as plugin
    installs and swarm services, never reach a plugin), after the repo's grants for
    `request.cdi_devices` were checked. Return `Refusal`s naming the CDI form to use instead,
    `Rewrite`s that turn a legacy request into the CDI form, or `[]`. The core's refusals and the
    plugins' are merged on `(rule, subject)`: a `Refusal` with a core rule's id (`raw-device`,
    `device-request-driver`, `runtime`) and the `subject` the core refused (the `PathOnHost`, the
    `Driver` or `--gpus` for an empty one, the `Runtime`) replaces the core's refusal of that value;
    one with no `subject` replaces every core refusal of its rule. `ctx.inventory` is the
    machine's typed `Inventory` (None before the first setup), rebuilt only when its file changes.

    Decisions run on the gate's event loop: before any blocking I/O of your own, call
    `rediacc_core.may_block()`, which moves the decision to a worker thread (`ctx.image_config`
    already does this).
    """
    raise NotImplementedError


@hookspec
def rdc_health(machine: Machine, inventory: Inventory) -> list[HealthEvent]:
    """Health events of this plugin's GPUs on `machine`: what the driver reported, new and old alike.

    Return every event still visible (the core records each `(pci_bus_id, key)` once, so an event
    an operator cleared stays cleared when it is returned again). Read the kernel's log with
    `rediacc_core.kernel_log(machine)`, never `/dev/kmsg` yourself, so simulated machines work.
    Called by each repo gate every housekeeping round (30 s) and before it lets a container holding
    devices start, and by `rdc machine gpu list --scan` and `rdc machine gpu clear`; return `[]`
    quickly when none of your GPUs is in `inventory`.
    """
    raise NotImplementedError


@hookspec
def rdc_housekeeping(
    machine: Machine, repo_id: str, log: Callable[[str], None]
) -> list[Callable[[], object]]:
    """Chores for the housekeeping round of the gate of repo `repo_id` on `machine`.

    Called once when the gate starts; each returned callable then runs every round (30 s) on the
    gate's housekeeping thread, never its event loop, so it may block, within seconds. A chore that
    raises is reported in the gate's log and runs again the next round; it never stops the gate. Say
    what a chore changed with `log(line)` (the gate's log). Every repo of a machine runs a gate, so a
    machine-wide chore takes a lock of its own and runs once a round, not once per repo. Return `[]`
    when the machine needs nothing from this plugin.
    """
    raise NotImplementedError
