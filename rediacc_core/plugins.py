"""Loading plugins and calling them.

Plugins are found only through the `rediacc` entry-point group: the three vendor plugins in this
repository register exactly as a third-party one would. A plugin that fails to load is recorded and
reported (`rdc plugins`), never a crash. `Plugins` is the typed facade the rest of the core calls
instead of `pm.hook`.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from rediacc_core.entrypoints import entry_points

if TYPE_CHECKING:
    from collections.abc import Callable

    import click
    import pluggy

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

ENTRY_POINT_GROUP = "rediacc"
LOAD_ENV = "REDIACC_LOAD_PLUGINS"


@dataclass(frozen=True)
class PluginInfo:
    """What `rdc plugins` shows for one entry point."""

    name: str
    distribution: str | None
    version: str | None
    hooks: tuple[str, ...] = ()
    error: str | None = None


class PluginLoadWarning(UserWarning):
    """A plugin could not be loaded; `rdc` goes on without it."""


def _wanted() -> frozenset[str] | None:
    raw = os.environ.get(LOAD_ENV)
    if raw is None:
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


@dataclass
class Plugins:
    """The loaded plugins, and typed calls of every hook."""

    pm: pluggy.PluginManager
    infos: list[PluginInfo] = field(default_factory=list)

    # --- typed facade over pm.hook ------------------------------------------------------------
    def discover(self, machine: Machine) -> list[Gpu]:
        return [gpu for found in self.pm.hook.rdc_discover(machine=machine) for gpu in found]

    def setup_options(self) -> list[click.Option]:
        return [opt for opts in self.pm.hook.rdc_setup_options() for opt in opts]

    def setup_steps(self, ctx: SetupContext) -> list[SetupStep]:
        steps = [step for found in self.pm.hook.rdc_setup_steps(ctx=ctx) for step in found]
        return sorted(steps, key=lambda s: s.order)  # stable: plugin order within an order value

    def cdi_specs(self, ctx: SetupContext) -> list[CdiSpecFile]:
        return [spec for found in self.pm.hook.rdc_cdi_specs(ctx=ctx) for spec in found]

    def hardware_units(self, name: str, inventory: Inventory) -> list[str] | None:
        result: list[str] | None = self.pm.hook.rdc_hardware_units(name=name, inventory=inventory)
        return result

    def request_rules(self, request: ApiRequest, ctx: GateContext) -> list[Verdict]:
        return [v for found in self.pm.hook.rdc_request_rules(request=request, ctx=ctx) for v in found]

    def health(self, machine: Machine, inventory: Inventory) -> list[HealthEvent]:
        return [e for found in self.pm.hook.rdc_health(machine=machine, inventory=inventory) for e in found]

    def housekeeping(
        self, machine: Machine, repo_id: str, log: Callable[[str], None]
    ) -> list[Callable[[], object]]:
        found = self.pm.hook.rdc_housekeeping(machine=machine, repo_id=repo_id, log=log)
        return [chore for chores in found for chore in chores]

    # --- introspection ------------------------------------------------------------------------
    def names(self) -> list[str]:
        return [info.name for info in self.infos if info.error is None]


def _hook_names(pm: pluggy.PluginManager, plugin: object) -> tuple[str, ...]:
    callers = pm.get_hookcallers(plugin) or []
    return tuple(sorted(caller.name for caller in callers))


def load_plugins(extra: list[tuple[str, object]] | None = None) -> Plugins:
    """Build a plugin manager from the `rediacc` entry points (and `extra`, for tests)."""
    # importlib.metadata, pluggy and the hook specs are imported here: `rdc --version` lists the
    # plugins without them (pluggy imports importlib.metadata itself).
    from importlib import metadata

    import pluggy

    from rediacc_core import hookspecs

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    wanted = _wanted()
    infos: list[PluginInfo] = []
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if wanted is not None and ep.name not in wanted:
            continue
        dist = ep.dist.name if ep.dist is not None else None
        version = ep.dist.version if ep.dist is not None else None
        if pm.has_plugin(ep.name):
            continue  # the same distribution seen twice on sys.path
        try:
            module = ep.load()
        except Exception as exc:  # any import-time failure is the plugin's, not rdc's
            infos.append(_broken(ep.name, dist, version, f"{type(exc).__name__}: {exc}"))
            continue
        error = _register(pm, ep.name, module)
        if error:
            infos.append(_broken(ep.name, dist, version, error))
        else:
            infos.append(PluginInfo(ep.name, dist, version, _hook_names(pm, module)))
    for name, plugin in extra or []:
        error = _register(pm, name, plugin)
        infos.append(
            _broken(name, None, None, error)
            if error
            else PluginInfo(name, None, None, _hook_names(pm, plugin))
        )
    return Plugins(pm, infos)


def _register(pm: pluggy.PluginManager, name: str, plugin: object) -> str | None:
    """Register one plugin and check it alone, so a bad plugin is dropped rather than breaking rdc."""
    import pluggy

    try:
        pm.register(plugin, name=name)
        # Checked per plugin: every plugin before this one already passed, so a failure is this one's.
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        if pm.is_registered(plugin):
            pm.unregister(plugin)
        return f"invalid hook implementation: {exc}"
    return None


def _broken(name: str, dist: str | None, version: str | None, error: str) -> PluginInfo:
    warnings.warn(
        f"plugin {name!r} ({dist or 'no distribution'}) failed to load: {error}",
        PluginLoadWarning,
        stacklevel=3,
    )
    return PluginInfo(name, dist, version, error=error)


@cache
def _from_entry_points() -> Plugins:
    return load_plugins()


_chosen: Plugins | None = None


def get_plugins() -> Plugins:
    """The process-wide plugins: loaded once from entry points, unless `set_plugins` chose others."""
    return _chosen if _chosen is not None else _from_entry_points()


def set_plugins(plugins: Plugins | None) -> None:
    """Make `get_plugins()` answer `plugins` (tests, embedders); None goes back to the entry points."""
    global _chosen
    _chosen = plugins


def installed() -> list[PluginInfo]:
    """The plugins `get_plugins()` would load, from their distributions' metadata alone: nothing is
    imported (`rdc --version`), not even `importlib.metadata` (`rediacc_core.entrypoints` reads the
    same files). Whether each loads, and its hooks, is `rdc plugins`' to say."""
    if _chosen is not None:
        return list(_chosen.infos)
    wanted = _wanted()
    infos: dict[str, PluginInfo] = {}
    for ep in sorted(entry_points(ENTRY_POINT_GROUP), key=lambda e: e.name):
        if (wanted is None or ep.name in wanted) and ep.name not in infos:
            infos[ep.name] = PluginInfo(ep.name, ep.distribution, ep.version)
    return list(infos.values())


def get_plugin_manager() -> pluggy.PluginManager:
    return get_plugins().pm
