"""The Container Device Interface as the core needs it: names, spec files and the device registry.

Vendor-neutral: plugins produce specs, this package checks and reads them the way the container
engine's CDI loader does, so what the gate allows is exactly what the daemon can inject.
"""

from __future__ import annotations

from rediacc_core.cdi.names import (
    CdiNameError,
    QualifiedName,
    is_qualified_name,
    parse_qualified_name,
    validate_class,
    validate_device_name,
    validate_vendor,
)
from rediacc_core.cdi.registry import DeviceEntry, Fingerprint, Registry, RegistryCache, fingerprint, suggest
from rediacc_core.cdi.spec import (
    KNOWN_VERSIONS,
    CdiSpecError,
    Spec,
    device_nodes,
    dump_spec,
    load_spec,
    validate_spec,
    write_spec,
)

__all__ = [
    "KNOWN_VERSIONS",
    "CdiNameError",
    "CdiSpecError",
    "DeviceEntry",
    "Fingerprint",
    "QualifiedName",
    "Registry",
    "RegistryCache",
    "Spec",
    "device_nodes",
    "dump_spec",
    "fingerprint",
    "is_qualified_name",
    "load_spec",
    "parse_qualified_name",
    "suggest",
    "validate_class",
    "validate_device_name",
    "validate_spec",
    "validate_vendor",
    "write_spec",
]
