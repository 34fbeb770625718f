"""Each repo gate's housekeeping round brings the machine's GPU health records up to date, so
`rdc machine gpu list` shows a card a driver faulted within one round (30 s) with no `--scan`, and
the metrics count it, whether or not a container start asked first."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from rediacc_core.errors import RdcError
from rediacc_core.health import record_events
from rediacc_core.inventory import read_inventory
from rediacc_core.machine import Machine

if TYPE_CHECKING:
    from rediacc_core.plugins import Plugins


def refresh_health(machine: Machine, plugins: Plugins, log: Callable[[str], None]) -> None:
    """Record the health events the plugins report now; a failure is logged and tried next round."""
    try:
        inventory = read_inventory(machine)
        if inventory is not None:
            record_events(machine, plugins.health(machine, inventory))
    except RdcError as exc:
        log(f"GPU health not read: {exc.what}")
    except Exception as exc:  # a plugin's failure: the records it left stand
        log(f"GPU health not read: {type(exc).__name__}: {exc}")
