"""rediacc_nvidia plugin for rediacc-core: hook implementations only.

Each hook hands over to the module that holds the knowledge: discovery (NVML, nvidia-smi, /proc),
toolkit (install plan, nvidia-cdi-refresh, /dev/char links, the `nvidia-ctk cdi generate` spec),
units (exclusive grants by hardware), health (XIDs and ECC errors), rules (the gate: non-CDI GPU
requests, NVIDIA_VISIBLE_DEVICES, NVIDIA_REQUIRE_*).
"""

from __future__ import annotations

import click

from rediacc_core import (
    ApiRequest,
    CdiSpecFile,
    GateContext,
    Gpu,
    HealthEvent,
    Inventory,
    Machine,
    SetupContext,
    SetupStep,
    Verdict,
    hookimpl,
)
from rediacc_nvidia import discovery, health, raw, rules, toolkit, units


@hookimpl
def rdc_discover(machine: Machine) -> list[Gpu]:
    return discovery.discover(machine)


@hookimpl
def rdc_setup_options() -> list[click.Option]:
    return [
        click.Option(
            [toolkit.OPTION_FLAG, toolkit.OPTION],
            type=click.Choice(toolkit.CHOICES, case_sensitive=False),
            default="auto",
            show_default=True,
            help="Install the NVIDIA Container Toolkit: auto (when an NVIDIA GPU is present), true (always) "
            "or false (never; no NVIDIA spec is generated).",
        )
    ]


@hookimpl
def rdc_setup_steps(ctx: SetupContext) -> list[SetupStep]:
    return toolkit.setup_steps(ctx)


@hookimpl
def rdc_cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    return toolkit.cdi_specs(ctx)


@hookimpl
def rdc_hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    return units.hardware_units(name, inventory)


@hookimpl
def rdc_request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    return rules.request_rules(request, ctx) + raw.request_rules(request, ctx)


@hookimpl
def rdc_health(machine: Machine, inventory: Inventory) -> list[HealthEvent]:
    return health.health(machine, inventory)
