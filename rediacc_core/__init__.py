"""rediacc-core: hand GPUs to isolated Docker workloads through CDI grants and an API gate.

The public face for plugin authors: `hookimpl` and the dataclasses hooks return. The dataclasses
are imported on first use, so a command that never needs them (one forwarded to an SSH machine)
does not pay for loading the CDI schema machinery.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

from rediacc_core.hookspecs import PROJECT

if TYPE_CHECKING:
    from rediacc_core.model import (
        ApiRequest,
        CdiSpecFile,
        GateContext,
        Gpu,
        GpuPartition,
        Refusal,
        Rewrite,
        SetupContext,
        SetupStep,
        Verdict,
    )

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker(PROJECT)

_FROM_MODEL = frozenset(
    {
        "ApiRequest",
        "CdiSpecFile",
        "GateContext",
        "Gpu",
        "GpuPartition",
        "Refusal",
        "Rewrite",
        "SetupContext",
        "SetupStep",
        "Verdict",
    }
)


def __getattr__(name: str) -> Any:
    if name in _FROM_MODEL:
        from rediacc_core import model

        return getattr(model, name)
    raise AttributeError(f"module 'rediacc_core' has no attribute {name!r}")


__all__ = [
    "ApiRequest",
    "CdiSpecFile",
    "GateContext",
    "Gpu",
    "GpuPartition",
    "Refusal",
    "Rewrite",
    "SetupContext",
    "SetupStep",
    "Verdict",
    "__version__",
    "hookimpl",
]
