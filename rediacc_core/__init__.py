"""rediacc-core: hand GPUs to isolated Docker workloads through CDI grants and an API gate.

The public face for plugin authors: `hookimpl` and the dataclasses hooks return.
"""

from __future__ import annotations

import pluggy

from rediacc_core.hookspecs import PROJECT
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
