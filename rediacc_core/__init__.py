"""rediacc-core: hand GPUs to isolated Docker workloads through CDI grants and an API gate.

The public face for plugin authors, and all of it: `hookimpl`, the dataclasses hooks take and
return (the machine's typed `Inventory` among them), the machine a hook works on, the error a
failing outside tool raises, the helpers for host paths, device nodes and atomic writes, and
`may_block()` for rules that wait on I/O. A plugin imports nothing else from the core
(`tests/test_architecture.py` checks it; a plugin's test kit may also use `rediacc_core.testing`).
Names (and `hookimpl`) are made on first use, so a command that never needs them (one forwarded to
an SSH machine) does not pay for loading pluggy and the CDI schema machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pluggy

    from rediacc_core.blocking import may_block
    from rediacc_core.cdi.devnodes import device_node_edit, host_node, sysfs_dev_numbers
    from rediacc_core.errors import ToolError
    from rediacc_core.files import atomic_write_text
    from rediacc_core.hostpaths import is_at_or_under, landing_paths
    from rediacc_core.kernlog import kernel_log
    from rediacc_core.machine import Machine
    from rediacc_core.model import (
        ApiRequest,
        CdiDevice,
        CdiSpecFile,
        GateContext,
        Gpu,
        GpuPartition,
        HealthEvent,
        Inventory,
        Refusal,
        Rewrite,
        SetupContext,
        SetupStep,
        Verdict,
    )

__version__ = "0.1.0"

if TYPE_CHECKING:
    hookimpl: pluggy.HookimplMarker

_FROM_MODEL = frozenset(
    {
        "ApiRequest",
        "CdiDevice",
        "CdiSpecFile",
        "GateContext",
        "Gpu",
        "GpuPartition",
        "HealthEvent",
        "Inventory",
        "Refusal",
        "Rewrite",
        "SetupContext",
        "SetupStep",
        "Verdict",
    }
)


# Everything else public, by the module that holds it.
_ELSEWHERE = {
    "Machine": "rediacc_core.machine",
    "ToolError": "rediacc_core.errors",
    "atomic_write_text": "rediacc_core.files",
    "is_at_or_under": "rediacc_core.hostpaths",
    "landing_paths": "rediacc_core.hostpaths",
    "kernel_log": "rediacc_core.kernlog",
    "may_block": "rediacc_core.blocking",
    "device_node_edit": "rediacc_core.cdi.devnodes",
    "host_node": "rediacc_core.cdi.devnodes",
    "sysfs_dev_numbers": "rediacc_core.cdi.devnodes",
}


def __getattr__(name: str) -> Any:
    if name == "hookimpl":  # made once, on first use (pluggy is not needed to forward a command)
        import pluggy

        from rediacc_core.hookspecs import PROJECT

        marker = pluggy.HookimplMarker(PROJECT)
        globals()["hookimpl"] = marker
        return marker
    if name in _FROM_MODEL:
        from rediacc_core import model

        return getattr(model, name)
    if name in _ELSEWHERE:
        return getattr(importlib.import_module(_ELSEWHERE[name]), name)
    raise AttributeError(f"module 'rediacc_core' has no attribute {name!r}")


__all__ = [
    "ApiRequest",
    "CdiDevice",
    "CdiSpecFile",
    "GateContext",
    "Gpu",
    "GpuPartition",
    "HealthEvent",
    "Inventory",
    "Machine",
    "Refusal",
    "Rewrite",
    "SetupContext",
    "SetupStep",
    "ToolError",
    "Verdict",
    "__version__",
    "atomic_write_text",
    "device_node_edit",
    "hookimpl",
    "host_node",
    "is_at_or_under",
    "kernel_log",
    "landing_paths",
    "may_block",
    "sysfs_dev_numbers",
]
