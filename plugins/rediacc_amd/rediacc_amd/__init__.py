"""rediacc_amd plugin for rediacc-core: AMD GPUs from the KFD topology as `rediacc.io/amd` CDI devices.

Hook implementations only; each delegates to the module named for what it holds.
"""

from __future__ import annotations

from rediacc_amd import discovery, health, rules, spec, units
from rediacc_core import (
    ApiRequest,
    CdiSpecFile,
    GateContext,
    Gpu,
    HealthEvent,
    Inventory,
    Machine,
    SetupContext,
    Verdict,
    hookimpl,
)


@hookimpl
def rdc_discover(machine: Machine) -> list[Gpu]:
    return discovery.discover(machine)


@hookimpl
def rdc_cdi_specs(ctx: SetupContext) -> list[CdiSpecFile]:
    return spec.cdi_specs(ctx)


@hookimpl
def rdc_hardware_units(name: str, inventory: Inventory) -> list[str] | None:
    return units.hardware_units(name, inventory)


@hookimpl
def rdc_request_rules(request: ApiRequest, ctx: GateContext) -> list[Verdict]:
    return rules.request_rules(request, ctx)


@hookimpl
def rdc_health(machine: Machine, inventory: Inventory) -> list[HealthEvent]:
    return health.health(machine, inventory)
